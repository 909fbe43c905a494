"""bench/ncu_source.py on a small source-page CSV of the form ncu writes: two launches of one
kernel, a wait whose failure branches into a sleep-and-retry loop."""

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
import ncu_source  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)",'
          '"Warp Stall Sampling (Not-issued Samples)","# Samples","Instructions Executed"')


def launch(name, rows):
    lines = [f'"Kernel Name","{name}",', HEADER]
    for address, source, samples, executed in rows:
        lines.append(f'"{address}","{source}","{samples}","0","{samples}","{executed}"')
    return "\n".join(lines)


def kernel_rows(retries, loop_runs):
    """A key-tile loop of 3 instructions run 1,000 times, a wait run 1,000 times whose failures
    branch to a retry loop that ran `retries` times, and a CTA prologue run 10 times; an inner
    loop of 2 instructions ran `loop_runs` times."""
    return [
        ("0x100", "LDC R1, c[0x0][0x28] ;", 5, 10),
        ("0x110", "S2R R0, SR_TID.X ;", 1, 10),
        ("0x120", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x20], R2 ;", 3, 1000),
        ("0x130", "@!P1 BRA 0x200 ;", 40, 1000),
        ("0x140", "FFMA R3, R4, R5, R3 ;", 100, 1000),
        ("0x150", "MUFU.EX2 R3, R3 ;", 300, "1,000"),
        ("0x160", "LDSM.16.M88.4 R4, [R8] ;", 20, loop_runs),
        ("0x170", "STSM.16.MT88.4 [R9], R4 ;", 20, loop_runs),
        ("0x180", "EXIT ;", 0, 10),
        ("0x200", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R6+URZ+0x20], R2 ;", 0, retries),
        ("0x210", "@!P1 NANOSLEEP.SYNCS 0x989680 ;", 0, retries),
        ("0x220", "@!P1 SYNCS.PHASECHK.TRANS64 P1, [R6+URZ+0x20], R2 ;", 0, retries),
        ("0x230", "@!P1 BRA 0x200 ;", 0, retries),
        ("0x240", "BRA 0x140 ;", 0, 0),
    ]


@pytest.fixture
def csv_file(tmp_path):
    text = "\n".join([launch("kernel<1>", kernel_rows(0, 0)),
                      launch("kernel<1>", kernel_rows(9000, 12000))]) + "\n"
    path = tmp_path / "source.csv"
    path.write_text(text)
    return path


def test_launches_and_counts_are_read(csv_file):
    kernels = ncu_source.read_kernels(csv_file.read_text())
    assert [name for name, _ in kernels] == ["kernel<1>", "kernel<1>"]
    rows = kernels[0][1]
    assert len(rows) == 14
    assert ncu_source.executed(rows[5]) == 1000.0  # "1,000" as ncu writes thousands


def test_bands_separate_the_tile_code_from_the_cta_code_and_an_inner_loop(csv_file):
    rows = ncu_source.read_kernels(csv_file.read_text())[1][1]
    found = {b: (n, lines) for b, n, lines in ncu_source.bands(rows)}
    assert found[1000] == (4000.0, 4)
    assert found[10] == (30.0, 3)
    assert found[12000] == (24000.0, 2)  # the inner loop: its own band
    assert found[9000] == (36000.0, 4)   # the retry loop
    first, last, band, n, samples = ncu_source.regions(rows)[0]
    assert (first, last, band, n) == (9, 12, 9000, 36000.0)


def test_opcodes_count_the_largest_band_per_run(csv_file):
    assert ncu_source.opcode("@!P1 BRA 0x200 ;") == "BRA"
    assert ncu_source.opcode("MUFU.EX2 R3, R3 ;") == "MUFU"
    rows = ncu_source.read_kernels(csv_file.read_text())[0][1]
    # Launch 0's largest band is the key-tile code run 1,000 times: one of each a run.
    assert ncu_source.opcodes(rows, 1000) == [("SYNCS", 1.0, 3.0), ("BRA", 1.0, 40.0),
                                              ("FFMA", 1.0, 100.0), ("MUFU", 1.0, 300.0)]
    out = ncu_source.report("kernel<1>", rows, 12)
    assert "| opcode (band 1e+03) | per run | samples |" in out
    assert "| all | 4 | 443 |" in out


def test_retry_loops_count_retries_against_first_tries(csv_file):
    kernels = ncu_source.read_kernels(csv_file.read_text())
    assert ncu_source.retry_loops(kernels[0][1]) == []  # it never ran
    [(address, source, retries, first)] = ncu_source.retry_loops(kernels[1][1])
    assert address == "0x200" and "TRYWAIT" in source
    assert (retries, first) == (9000.0, 1000.0)  # its own back branch is not a first try


def test_diff_names_the_blocks_that_changed(csv_file, capsys):
    args = [str(csv_file), "--kernel", "1", "--diff", "0", "1", "--block", "4"]
    assert ncu_source.main(args) == 0
    out = capsys.readouterr().out
    assert "| 0x200 |" in out  # launch 1's retry loop in its table
    diff_rows = [line for line in out.split("# launch 0 against launch 1")[1].splitlines()
                 if line.startswith("| ") and "SASS" not in line]
    # The retry loop's block first (27,000 more instructions), then the inner loop's (24,000).
    assert [row.split(" |")[0] for row in diff_rows[:2]] == ["| 8-11", "| 4-7"]


def test_a_file_without_launches_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text('"ID","Metric Name"\n')
    with pytest.raises(SystemExit, match="no kernel section"):
        ncu_source.main([str(path)])
