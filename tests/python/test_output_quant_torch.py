"""detect_output_quant_key and the attention ops' output scales through torch: the keys of the
outputs and scales fp8mla's quantization ops allocate, on the CPU and (metadata only, any build)
on a CUDA device; detection is not a torch custom op; a quantized `out` of the attention custom
ops is the unsupported-capability error. Skipped (visibly) without torch."""

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


def test_attention_ops_reject_quantized_out():
    q = torch.zeros(T, 4, 192, dtype=torch.bfloat16)
    v = torch.zeros(T, 4, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, T], dtype=torch.int32)
    out = torch.empty(T, 4, 128, dtype=torch.float8_e4m3fn)
    scales = torch.empty(T, 4, dtype=torch.float32)
    with pytest.raises(fp8mla.UnsupportedError,
                       match="fused output quantization fp8_group128 is not built yet"):
        fp8mla.prefill_attention(q, q, v, cu, cu, 6, 6, softmax_scale=0.1, out=out,
                                 output_block_scale=scales)
    lse = torch.zeros(T, 4, dtype=torch.float32)
    with pytest.raises(fp8mla.UnsupportedError,
                       match="fused output quantization fp8_static is not built yet"):
        fp8mla.merge_attention_states(v, lse, v, lse, out=out,
                                      output_scale=torch.ones(1, dtype=torch.float32))
