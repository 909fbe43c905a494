"""bench/kernel_resources.py's loop table (--loops) on SASS lines of the form `cuobjdump -sass`
prints: each instruction with its low word, then a line with its high word (the stall count in
bits 41-44). Running it on a binary needs cuobjdump; this checks the parsing."""

import os
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
import kernel_resources  # noqa: E402


def sass(program):
    """cuobjdump-style lines of (address, text, stall count) triples."""
    lines = []
    for address, text, stall in program:
        lines.append(f"        /*{address:04x}*/                   {text} ;"
                     f"                  /* 0x000000000000{address:04x} */")
        lines.append(f"{' ' * 40}/* {stall << 41:#018x} */")
    return lines


# A turn loop (MMA, exponential, shuffle), a loop without MMA, and an out-of-line barrier retry
# after the EXIT that branches back into the body.
PROGRAM = [
    (0x00, "LDC R1, c[0x0][0x28]", 1),
    (0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x8], R2", 2),
    (0x20, "@!P0 BRA 0xa0", 1),
    (0x30, "QGMMA.64x128x32.F32.E4M3.E4M3 R24, R200, gdesc[UR8], R24, gsb0", 1),
    (0x40, "SHFL.BFLY PT, R3, R4, 0x1, 0x1f", 4),
    (0x50, "MUFU.EX2 R5, R5", 8),
    (0x60, "@P1 BRA 0x10", 5),
    (0x70, "LDSM.16.M88.4 R8, [R9]", 2),
    (0x80, "@P2 BRA 0x70", 3),
    (0x90, "EXIT", 5),
    (0xa0, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x8], R2", 1),
    (0xb0, "@!P0 NANOSLEEP.SYNCS 0x989680", 1),
    (0xc0, "BRA 0x30", 1),
]


def test_instructions_read_the_stall_count_from_the_high_word():
    ins = kernel_resources.instructions(sass(PROGRAM))
    assert len(ins) == len(PROGRAM)
    assert ins[5] == (0x50, "MUFU.EX2 R5, R5", 8)
    assert ins[2] == (0x20, "@!P0 BRA 0xa0", 1)


def test_only_the_mma_loop_is_a_loop():
    ins = kernel_resources.instructions(sass(PROGRAM))
    # 0x10-0x60 issues an MMA; 0x70-0x80 issues none; 0x30-0xc0 (the retry's branch back) spans
    # the EXIT.
    assert kernel_resources.mma_loops(ins) == [(0x10, 0x60)]


def test_an_outer_loop_around_an_mma_loop_is_left_out():
    program = PROGRAM[:7] + [(0x70, "@P3 BRA 0x0", 1)]
    ins = kernel_resources.instructions(sass(program))
    assert kernel_resources.mma_loops(ins) == [(0x10, 0x60)]


def test_loop_rows_count_the_body(monkeypatch):
    dump = ["\t\tFunction : other_kernel", *sass(PROGRAM[:1]),
            "\t\tFunction : the_kernel", *sass(PROGRAM)]
    monkeypatch.setattr(kernel_resources, "lines_of", lambda cmd: dump)
    [row] = kernel_resources.loop_rows("cuobjdump", "lib.a", "the_kernel")
    listing = row.pop("listing")
    assert row == {"kernel": "the_kernel", "SASS": "0x10-0x60", "instructions": 6,
                   "stall cycles": 2 + 1 + 1 + 4 + 8 + 5, "MMA": 1, "MUFU": 1, "LDSM/STSM": 0,
                   "SHFL": 1}
    assert listing == [(a, stall, text) for a, text, stall in PROGRAM[1:7]]


def test_loop_listing_gives_each_instruction_its_stall_count(monkeypatch):
    dump = ["\t\tFunction : the_kernel", *sass(PROGRAM)]
    monkeypatch.setattr(kernel_resources, "lines_of", lambda cmd: dump)
    text = kernel_resources.loop_listing(kernel_resources.loop_rows("cuobjdump", "x", "the_kernel"))
    lines = text.splitlines()
    assert lines[0] == "# the_kernel 0x10-0x60: 6 instructions, 21 stall cycles"
    assert lines[5] == "0x00050  8  MUFU.EX2 R5, R5"
    assert len(lines) == 7
