"""fp8mla — FP8 MLA prefill for NVIDIA Hopper, with a CPU implementation of every op.

Quantization ops (DESIGN sections 2 and 3). Tensors cross through DLPack: torch tensors (CPU or
CUDA; each op is also a torch.library custom op, see fp8mla.torch_ops), numpy arrays (CPU; bf16
and fp8 through ml_dtypes), or any other DLPack array when every output is given. Outputs are
allocated on the input's device when not given. Bad arguments raise fp8mla.Error (its subclass
InvalidArgumentError is also a ValueError) with the C++ library's message.

    quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3") -> out
    quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3") -> (out, scale)
    quantize_fp8_per_token_group(x, *, group_size=128, eps=1e-10, scale_layout="row_major",
                                 round_scale_to_pow2=False, out=None, scales=None) -> (out, scales)
    quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None)
        -> (out, block_scales)
    info() -> dict

Every op also takes `stream=` (an int cudaStream_t handle); by default CUDA torch tensors use
torch.cuda.current_stream().
"""

from __future__ import annotations

import sys

from . import _C
from ._C import Error, InvalidArgumentError, UnsupportedError

__version__ = _C.__version__

__all__ = [
    "Error",
    "InvalidArgumentError",
    "UnsupportedError",
    "info",
    "quantize_fp8",
    "quantize_fp8_dynamic",
    "quantize_fp8_per_token_group",
    "quantize_nvfp4",
]

_torch_ops = None


def _load_torch_ops():
    global _torch_ops
    if _torch_ops is None:
        from . import torch_ops

        _torch_ops = torch_ops
    return _torch_ops


# Engines import torch first: register the custom ops now, so that torch.compile traces straight
# into them. Otherwise they are registered when the first torch tensor arrives.
if "torch" in sys.modules:
    _load_torch_ops()


def _frontend(x):
    root = type(x).__module__.partition(".")[0]
    if root == "torch":
        return _torch_ops if _torch_ops is not None else _load_torch_ops()
    if root == "numpy":
        from . import _numpy

        return _numpy
    return _Generic


class _Generic:
    """Other DLPack arrays (cupy, jax, ...): passed through as they are; outputs must be given."""

    @staticmethod
    def _need(op, **outputs):
        missing = [name for name, value in outputs.items() if value is None]
        if missing:
            raise TypeError(
                f"fp8mla.{op}: allocating outputs is supported for torch and numpy arrays; "
                f"pass {', '.join(missing)} explicitly"
            )

    @staticmethod
    def quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3", stream=None):
        _Generic._need("quantize_fp8", out=out)
        scale = float(scale_inv) if isinstance(scale_inv, (int, float)) else scale_inv
        _C.quantize_fp8(x, out, scale, stream or 0)
        return out

    @staticmethod
    def quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3", stream=None):
        _Generic._need("quantize_fp8_dynamic", out=out, scale=scale)
        _C.quantize_fp8_dynamic(x, out, scale, stream or 0)
        return out, scale

    @staticmethod
    def quantize_fp8_per_token_group(x, *, group_size=128, eps=1e-10, scale_layout="row_major",
                                     round_scale_to_pow2=False, out=None, scales=None,
                                     stream=None):
        _Generic._need("quantize_fp8_per_token_group", out=out, scales=scales)
        _C.quantize_fp8_per_token_group(x, out, scales, group_size, eps, round_scale_to_pow2,
                                        stream or 0)
        return out, scales

    @staticmethod
    def quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None,
                       stream=None):
        _Generic._need("quantize_nvfp4", out=out, block_scales=block_scales)
        _C.quantize_nvfp4(x, out, block_scales, global_scale, layout, stream or 0)
        return out, block_scales


def quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3", stream=None):
    """Per-tensor FP8: out = fp8(x * scale_inv), nearest-even, saturating.

    `scale_inv` is a float or a one-element f32 tensor on x's device (read by the kernel, so a
    captured CUDA graph sees its current value). `dtype` "e4m3" or "e5m2"."""
    return _frontend(x).quantize_fp8(x, scale_inv, out=out, dtype=dtype, stream=stream)


def quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3", stream=None):
    """Dynamic per-tensor FP8: scale = max(amax / fp8_max, min) into `scale` (one f32), then
    out = fp8(x * (1 / scale)). Returns (out, scale)."""
    return _frontend(x).quantize_fp8_dynamic(x, out=out, scale=scale, dtype=dtype, stream=stream)


def quantize_fp8_per_token_group(x, *, group_size=128, eps=1e-10, scale_layout="row_major",
                                 round_scale_to_pow2=False, out=None, scales=None, stream=None):
    """Per-token-group FP8 e4m3 (groups of 64 or 128 along the last dim). Returns (out, scales).

    Allocated scales follow `scale_layout`: "row_major" f32 [M, G]; "column_major" f32 strides
    (1, M); "tma_aligned" f32 strides (1, round_up(M, 4)); "ue8m0" one exponent byte per group
    [M, G]; "packed_ue8m0" int32 [M, ceil(G/4)] strides (1, round_up(M, 4)). Given `scales`, its
    dtype and strides decide the layout."""
    return _frontend(x).quantize_fp8_per_token_group(
        x, group_size=group_size, eps=eps, scale_layout=scale_layout,
        round_scale_to_pow2=round_scale_to_pow2, out=out, scales=scales, stream=stream)


def quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None,
                   stream=None):
    """NVFP4: blocks of 16 along K, e4m3 block scales (128x4 swizzled or linear), two e2m1 values
    per byte. Returns (out [.., K/2], block_scales)."""
    return _frontend(x).quantize_nvfp4(x, global_scale, layout=layout, out=out,
                                       block_scales=block_scales, stream=stream)


def info() -> dict:
    """Build and device information: version, cuda (bool), cuda_arch, devices, ..."""
    return _C.info()
