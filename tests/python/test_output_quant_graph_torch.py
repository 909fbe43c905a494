"""A padded batch through the Python API (docs/design.md section 6, CUDA-graph padding): outputs
and scales allocated for T_PAD tokens, the real count set by cu_seqlens_q (prefill_attention) or
num_tokens (merge_attention_states). On CUDA the fused call is captured once in a
torch.cuda.CUDAGraph and replayed with different real token counts, only the device contents of
cu_seqlens / num_tokens changing: each replay gives the eager call's bytes, the real rows are the
standalone op's over the real rows, the padded rows of `out` and the scales keep the poison
written before the replay, the swizzled NVFP4 padding past T_PAD is zeros and the scale tensor
keeps its padded strides. On the CPU the same contract, eagerly. Skipped (visibly) without torch
or, for the graphs, without a CUDA device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import fp8mla  # noqa: E402
import fp8mla.torch_ops  # noqa: E402,F401
from fp8mla_reference import swizzled_offset  # noqa: E402
from torch_helpers import capture, needs_gpu  # noqa: E402

H, D = 4, 128
W = H * D
T_PAD, TK_PAD = 250, 288  # 250: TMA-aligned scales pad to 252 rows, swizzled ones to 256
MAX_SEQLEN = 160  # the bounds captured with the graph (2 sequences: 2 * 160 >= T_PAD, TK_PAD)
# (query counts, key counts) of the two sequences of each replay: the capture's first.
REPLAYS = [([130, 3], [140, 3]), ([100, 20], [100, 30]), ([7, 0], [7, 5])]
MERGE_REPLAYS = [133, 120, T_PAD, 7]
POISONS = [0xFF, 0x5A, 0xC3]


def cases(device):
    """(name, allocate() -> (out, output_scale, output_block_scale), standalone(rows) ->
    (out, block)) for T_PAD rows: the fused call's tensors allocated as the standalone op
    allocates them for the padded count."""
    zeros = torch.zeros(T_PAD, W, dtype=torch.bfloat16, device=device)
    for group, layout in ((128, "tma_aligned"), (128, "packed_ue8m0"), (128, "column_major"),
                          (64, "tma_aligned"), (64, "ue8m0")):
        def run(rows, group=group, layout=layout):
            return fp8mla.quantize_fp8_per_token_group(rows, group_size=group,
                                                       scale_layout=layout)

        def allocate(run=run):
            out, scales = run(zeros)
            return out, None, scales
        yield f"group{group} {layout}", allocate, run
    one = torch.full((1,), 150.0, device=device)
    yield ("static", lambda: (torch.empty(T_PAD, W, dtype=torch.float8_e4m3fn, device=device),
                              one, None),
           lambda rows: (fp8mla.quantize_fp8(rows, one), None))
    global_scale = torch.full((1,), 500.0, device=device)
    for layout in ("swizzled", "linear"):
        def run(rows, layout=layout):
            return fp8mla.quantize_nvfp4(rows, global_scale, layout=layout)

        def allocate(run=run):
            out, block = run(zeros)
            return out, global_scale, block
        yield f"nvfp4 {layout}", allocate, run


def bits(t):
    """`t` as integers of its element size, same strides."""
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int32)


def poison_value(t, byte):
    """The element of bits(t) whose every byte is `byte`."""
    return byte if t.element_size() == 1 else int.from_bytes([byte] * 4, "little", signed=True)


def poison(t, byte):
    if t is not None:
        bits(t).fill_(poison_value(t, byte))


def scale_rows(block, swizzled):
    """The scale tensor as logical rows [R, C] of its element bits (swizzled tiles unpacked)."""
    if not swizzled:
        return bits(block)
    rows, cols = block.shape[0], block.shape[1]
    index = torch.tensor([[swizzled_offset(m, kb, cols) for kb in range(cols)]
                          for m in range(rows)], device=block.device)
    return bits(block).reshape(-1)[index]


def expect_padded(name, out, block, want_out, want_block, real, byte):
    """out and block (T_PAD rows) hold the standalone op's real rows and `byte` past them; the
    swizzled NVFP4 rows T_PAD .. round_up(T_PAD, 128) are zeros."""
    got = bits(out).reshape(T_PAD, -1)
    assert torch.equal(got[:real], bits(want_out).reshape(real, -1)), name
    assert bool((got[real:] == poison_value(out, byte)).all()), name
    if block is None:
        return
    swizzled = name.startswith("nvfp4 swizzled")
    rows, want = scale_rows(block, swizzled), scale_rows(want_block, swizzled)
    assert torch.equal(rows[:real], want[:real]), name
    assert bool((rows[real:T_PAD] == poison_value(block, byte)).all()), name
    if swizzled:
        assert bool((rows[T_PAD:] == 0).all()), name


class PaddedBatch:
    """q, k, v (bf16) sized for T_PAD queries and TK_PAD keys; cu_seqlens set per replay."""

    def __init__(self, device):
        g = torch.Generator().manual_seed(11)
        self.q = (torch.rand(T_PAD, H, 192, generator=g) * 2 - 1).to(torch.bfloat16).to(device)
        self.k = (torch.rand(TK_PAD, H, 192, generator=g) * 2 - 1).to(torch.bfloat16).to(device)
        self.v = (torch.rand(TK_PAD, H, D, generator=g) * 8 - 4).to(torch.bfloat16).to(device)
        self.cu_q = torch.zeros(3, dtype=torch.int32, device=device)
        self.cu_k = torch.zeros(3, dtype=torch.int32, device=device)

    def set(self, replay):
        (q0, q1), (k0, k1) = replay
        self.cu_q.copy_(torch.tensor([0, q0, q0 + q1], dtype=torch.int32))
        self.cu_k.copy_(torch.tensor([0, k0, k0 + k1], dtype=torch.int32))
        return q0 + q1

    def attend(self, out=None, output_scale=None, output_block_scale=None):
        return fp8mla.prefill_attention(self.q, self.k, self.v, self.cu_q, self.cu_k, MAX_SEQLEN,
                                        MAX_SEQLEN, softmax_scale=0.07, out=out,
                                        output_scale=output_scale,
                                        output_block_scale=output_block_scale)


class PaddedStates:
    """bf16 merge states of T_PAD tokens (a third of the lse -inf) and num_tokens."""

    def __init__(self, device):
        g = torch.Generator().manual_seed(13)
        self.o_a = (torch.rand(T_PAD, H, D, generator=g) * 8 - 4).to(torch.bfloat16).to(device)
        self.o_b = (torch.rand(T_PAD, H, D, generator=g) * 8 - 4).to(torch.bfloat16).to(device)
        lse = torch.rand(T_PAD, H, generator=g) * 16 - 8
        self.lse_a = torch.where(torch.arange(T_PAD * H).view(T_PAD, H) % 3 == 0, -torch.inf,
                                 lse).to(device)
        self.lse_b = lse.flip(0).to(device)
        self.num_tokens = torch.zeros(1, dtype=torch.int32, device=device)

    def set(self, real):
        self.num_tokens.fill_(real)
        return real

    def merge(self, out=None, output_scale=None, output_block_scale=None, out_lse=None,
              padded=True):
        return fp8mla.merge_attention_states(
            self.o_a, self.lse_a, self.o_b, self.lse_b, out=out, out_lse=out_lse,
            output_scale=output_scale, output_block_scale=output_block_scale,
            num_tokens=self.num_tokens if padded else None)[0]


def unfused_rows(op, real):
    """The bf16 output's real rows [real, W], from the eager call without a key."""
    out = op.attend() if isinstance(op, PaddedBatch) else op.merge(padded=False)
    return out[:real].reshape(real, W)


def fused(op, out, scale, block):
    if isinstance(op, PaddedBatch):
        op.attend(out, scale, block)
    else:
        op.merge(out, scale, block, out_lse=op.out_lse)


def make_op(kind, device):
    if kind == "prefill_attention":
        return PaddedBatch(device), REPLAYS
    op = PaddedStates(device)
    op.out_lse = torch.empty(T_PAD, H, device=device)
    return op, MERGE_REPLAYS


@pytest.mark.parametrize("kind", ["prefill_attention", "merge_attention_states"])
def test_padded_call_on_the_cpu(kind):
    op, replays = make_op(kind, "cpu")
    for i, replay in enumerate(replays):
        real = op.set(replay)
        rows = unfused_rows(op, real)
        for name, allocate, standalone in cases("cpu"):
            out, scale, block = allocate()
            poison(out, POISONS[i % 3])
            poison(block, POISONS[i % 3])
            fused(op, out, scale, block)
            want_out, want_block = standalone(rows)
            expect_padded(f"{name}, replay {i}", out, block, want_out, want_block, real,
                          POISONS[i % 3])


@needs_gpu
@pytest.mark.parametrize("kind", ["prefill_attention", "merge_attention_states"])
def test_cuda_graph_replays_with_fewer_real_tokens(kind):
    op, replays = make_op(kind, "cuda")
    unfused = []
    for replay in replays:
        real = op.set(replay)
        unfused.append((real, unfused_rows(op, real).clone()))
    for name, allocate, standalone in cases("cuda"):
        out, scale, block = allocate()
        eager_out, _, eager_block = allocate()
        strides = block.stride() if block is not None else None
        op.set(replays[0])
        graph = capture(lambda: fused(op, out, scale, block))
        for i, replay in enumerate(replays):
            byte = POISONS[i % 3]
            real = op.set(replay)
            for t in (out, block, eager_out, eager_block):
                poison(t, byte)
            graph.replay()
            torch.cuda.synchronize()
            replayed = [bits(out).clone()] + ([bits(block).clone()] if block is not None else [])
            fused(op, eager_out, scale, eager_block)
            torch.cuda.synchronize()
            label = f"{name}, replay {i}: {real} tokens"
            assert torch.equal(replayed[0], bits(eager_out)), label
            if block is not None:
                assert block.stride() == strides, label
                assert torch.equal(replayed[1], bits(eager_block)), label
            want_out, want_block = standalone(unfused[i][1])
            expect_padded(label, out, block, want_out, want_block, real, byte)
