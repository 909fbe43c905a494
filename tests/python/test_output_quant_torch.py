"""detect_output_quant_key and the attention ops' output scales through torch: the keys of the
outputs and scales fp8mla's quantization ops allocate, on the CPU and (metadata only, any build)
on a CUDA device; detection is not a torch custom op; the attention ops fuse the quantization of a
quantized `out` on CPU and CUDA tensors (the bytes of the unfused op followed by the standalone
op on the same device, the schema marking the scales mutated). Skipped (visibly) without torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import fp8mla  # noqa: E402
import fp8mla.torch_ops  # noqa: E402,F401

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device visible to torch"))]
T, W = 10, 512


def test_not_a_custom_op():
    assert not hasattr(torch.ops.fp8mla, "detect_output_quant_key")
    assert hasattr(torch.ops.fp8mla, "prefill_attention")


@pytest.mark.parametrize("device", DEVICES)
def test_keys(device):
    out = torch.empty(T, W, dtype=torch.float8_e4m3fn, device=device)
    one = torch.ones(1, dtype=torch.float32, device=device)
    assert fp8mla.detect_output_quant_key(torch.empty(T, W, dtype=torch.bfloat16,
                                                      device=device)) is None
    assert fp8mla.detect_output_quant_key(out, one) == "fp8_static"
    column_major = torch.empty(4, 12, dtype=torch.float32, device=device)[:, :T].t()
    assert fp8mla.detect_output_quant_key(out, None, column_major) == "fp8_group128"
    packed = torch.empty(2, 12, dtype=torch.int32, device=device)[:, :T].t()
    assert fp8mla.detect_output_quant_key(out, output_block_scale=packed) == "fp8_group64"
    if hasattr(torch, "float8_e8m0fnu"):
        ue8m0 = torch.empty(T, 8, dtype=torch.float8_e8m0fnu, device=device)
        assert fp8mla.detect_output_quant_key(out, output_block_scale=ue8m0) == "fp8_group64"
    fp4 = torch.empty(T, W // 2, dtype=torch.uint8, device=device)
    block = torch.empty(128, 32, dtype=torch.float8_e4m3fn, device=device)
    assert fp8mla.detect_output_quant_key(fp4, one, block) == "nvfp4"
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected the global scale"):
        fp8mla.detect_output_quant_key(fp4, None, block)
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected at least 10 rows"):
        fp8mla.detect_output_quant_key(out, None, column_major[:9])


def test_keys_of_quantize_outputs():
    x = torch.zeros(13, W, dtype=torch.bfloat16)
    for layout in ("row_major", "column_major", "tma_aligned", "ue8m0", "packed_ue8m0"):
        for group in (64, 128):
            out, scales = fp8mla.quantize_fp8_per_token_group(x, group_size=group,
                                                              scale_layout=layout)
            key = fp8mla.detect_output_quant_key(out, output_block_scale=scales)
            assert key == f"fp8_group{group}", layout
    one = torch.ones(1, dtype=torch.float32)
    out, block_scales = fp8mla.quantize_nvfp4(x, one)
    assert fp8mla.detect_output_quant_key(out, one, block_scales) == "nvfp4"


def attention_inputs():
    g = torch.Generator().manual_seed(3)
    q = (torch.rand(T, 4, 192, generator=g) * 2 - 1).to(torch.bfloat16)
    v = (torch.rand(T, 4, 128, generator=g) * 8 - 4).to(torch.bfloat16)
    cu_q = torch.tensor([0, 4, T], dtype=torch.int32)
    cu_k = torch.tensor([0, 2, 8], dtype=torch.int32)  # first sequence: rows 0, 1 see no key
    return q, v, cu_q, cu_k


def poison(t):
    """Fills `t` (any strides) with values the op never writes: NaN bits."""
    bits(t).fill_(-1)


def bits(t):
    """`t` as integers of its element size, same strides."""
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int32)


def quantized_cases(device="cpu"):
    """(name, out, output_scale, output_block_scale, standalone(x) -> (out, scales)): the fused
    arguments allocated as the standalone op allocates its outputs."""
    one = torch.full((1,), 150.0, device=device)
    x = torch.zeros(T, W, dtype=torch.bfloat16, device=device)
    for layout in ("column_major", "tma_aligned", "ue8m0", "packed_ue8m0"):
        for group in (128, 64):
            def run(rows, group=group, layout=layout):
                return fp8mla.quantize_fp8_per_token_group(rows, group_size=group,
                                                           scale_layout=layout)
            out, scales = run(x)
            yield f"group{group} {layout}", out, None, scales, run
    yield ("static", torch.empty(T, 4, 128, dtype=torch.float8_e4m3fn, device=device), one, None,
           lambda rows: (fp8mla.quantize_fp8(rows, one), None))
    global_scale = torch.full((1,), 500.0, device=device)
    for layout in ("swizzled", "linear"):
        def run(rows, layout=layout):
            return fp8mla.quantize_nvfp4(rows, global_scale, layout=layout)
        out, block = run(x)
        yield f"nvfp4 {layout}", out, global_scale, block, run


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["prefill_attention", "merge_attention_states"])
def test_attention_ops_fuse(op, device):
    q, v, cu_q, cu_k = (t.to(device) for t in attention_inputs())
    k, kv = q[:8], v[:8]
    lse = torch.where(torch.arange(T * 4).view(T, 4) % 3 == 0, -torch.inf, 0.5).to(device)

    def call(out=None, output_scale=None, output_block_scale=None):
        if op == "prefill_attention":
            return fp8mla.prefill_attention(q, k, kv, cu_q, cu_k, 6, 6, softmax_scale=0.1,
                                            out=out, output_scale=output_scale,
                                            output_block_scale=output_block_scale)
        return fp8mla.merge_attention_states(v, lse, v.flip(0), lse.flip(0), out=out,
                                             output_scale=output_scale,
                                             output_block_scale=output_block_scale)[0]

    rows = call().reshape(T, W)
    for name, out, scale, block, standalone in quantized_cases(device):
        poison(out)
        if block is not None:
            poison(block)
        assert call(out, scale, block) is out
        want_out, want_block = standalone(rows)
        assert torch.equal(bits(out).reshape(T, -1), bits(want_out).reshape(T, -1)), name
        if block is not None:
            assert block.stride() == want_block.stride(), name
            assert torch.equal(bits(block), bits(want_block)), name


def test_schemas_mark_the_scales_mutated():
    for name, outputs in (("prefill_attention", {"out", "lse"}),
                          ("merge_attention_states", {"out", "out_lse"})):
        arguments = getattr(torch.ops.fp8mla, name).default._schema.arguments
        got = {a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write}
        assert got == outputs | {"output_block_scale"}, name


def test_opcheck_quantized_out():
    """The schema (what the CPU kernel writes is declared mutated) and the fake, on NVFP4 as raw
    uint8 bytes (the schema test compares values, which torch cannot for float8)."""
    q, v, cu_q, cu_k = attention_inputs()
    fp4 = torch.empty(T, W // 2, dtype=torch.uint8)
    checks = ("test_schema", "test_faketensor")
    for block in (torch.empty(128, 32, dtype=torch.uint8), torch.empty(T, 32, dtype=torch.uint8)):
        torch.library.opcheck(torch.ops.fp8mla.prefill_attention.default,
                              (q, q[:8], v[:8], cu_q, cu_k, 6, 6, 0.1, True, None, None, None,
                               fp4, None, torch.full((1,), 500.0), block, None, None, None, 0),
                              test_utils=checks)
        lse = torch.zeros(T, 4)
        torch.library.opcheck(torch.ops.fp8mla.merge_attention_states.default,
                              (v, lse, v, lse, fp4, torch.empty(T, 4), torch.full((1,), 500.0),
                               block, None, 0), test_utils=checks)


def test_compiled_fused_call_equals_eager():
    # torch.compile(fullgraph=True) over the fused call and a read of the scales it wrote gives
    # the eager bytes (aot_eager: functionalization without C++ code generation).
    q, v, cu_q, cu_k = attention_inputs()

    def attend(out, scales):
        fp8mla.prefill_attention(q, q[:8], v[:8], cu_q, cu_k, 6, 6, softmax_scale=0.1, out=out,
                                 output_block_scale=scales)
        return scales.sum()

    eager_out, eager_scales = torch.empty(T, W, dtype=torch.float8_e4m3fn), torch.zeros(T, 4)
    eager = attend(eager_out, eager_scales)
    out, scales = torch.empty(T, W, dtype=torch.float8_e4m3fn), torch.zeros(T, 4)
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")(out, scales)
    assert torch.equal(compiled, eager) and eager > 0
    assert torch.equal(bits(out), bits(eager_out)) and torch.equal(scales, eager_scales)
