"""The torch front end: each op is a torch.library custom op in the namespace ``fp8mla`` (with a
fake implementation), so it works under torch.compile(fullgraph=True) and CUDA graph capture.

Custom ops (they write into their caller-allocated outputs and return nothing):
    torch.ops.fp8mla.quantize_fp8(x, out, scale_inv: float, dtype, stream)
    torch.ops.fp8mla.quantize_fp8_scale_tensor(x, out, scale_inv: Tensor, dtype, stream)
    torch.ops.fp8mla.quantize_fp8_dynamic(x, out, scale, dtype, stream)
    torch.ops.fp8mla.quantize_fp8_per_token_group(x, out, scales, group_size, eps,
                                                  round_scale_to_pow2, stream)
    torch.ops.fp8mla.quantize_nvfp4(x, out, block_scales, global_scale, layout, stream)
    torch.ops.fp8mla.make_cos_sin_cache(cos_sin, rope_dim, theta, yarn: float[6]?, stream)
    torch.ops.fp8mla.mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, style,
        q_scale_inv, k_scale_inv, q_out, k_out, kv_c?, cache?, slot_mapping?, cache_scale_inv,
        error_flag?, stream)                     (mutates q_out, k_out, cache, error_flag)
    torch.ops.fp8mla.mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, scale_inv, error_flag?,
        stream)                                  (mutates cache, error_flag)
    torch.ops.fp8mla.mla_kv_gather(cache, slots, scale, kv_c_out, k_pe_out, error_flag?, stream)
    torch.ops.fp8mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, k_scale_inv, v_scale_inv, k_out,
        v_out, v_layout, stream)                 (mutates k_out, v_out)
    torch.ops.fp8mla.mla_v_quantize_fp8(v, v_scale_inv, v_out, v_layout, stream)  (mutates v_out)
`stream` 0 means torch's current stream on x's device. The functions of this module allocate the
outputs (torch.empty on x's device) and call these ops; fp8mla.quantize_* call them for torch
tensors.
"""

from __future__ import annotations

import torch

from . import _C
from typing import List, Optional

from ._common import (
    FP8_DTYPES,
    MLA,
    NVFP4_LAYOUTS,
    SCALE_LAYOUTS,
    V_LAYOUTS,
    check_choice,
    gather_rows,
    group_scale_plan,
    nvfp4_shapes,
    out_shape,
    transposed_pitch,
    yarn_tuple,
)

# torch dtype -> fp8mla dtype name, for types passed to the C++ library as uint8 views (torch
# may not export them through DLPack).
_BYTE_DTYPES = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}
if hasattr(torch, "float8_e8m0fnu"):
    _BYTE_DTYPES[torch.float8_e8m0fnu] = "ue8m0"
if hasattr(torch, "float4_e2m1fn_x2"):
    _BYTE_DTYPES[torch.float4_e2m1fn_x2] = "e2m1x2"

FP8_TORCH_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
UE8M0_TORCH_DTYPE = getattr(torch, "float8_e8m0fnu", torch.uint8)
NVFP4_TORCH_DTYPE = getattr(torch, "float4_e2m1fn_x2", torch.uint8)


def _arg(t: torch.Tensor, raw_dtype: str | None = None):
    """The argument _C takes for tensor `t`: a DLPack capsule or (capsule, fp8mla dtype name)."""
    t = t.detach()
    name = _BYTE_DTYPES.get(t.dtype)
    if name is not None:
        t = t.view(torch.uint8)
    elif raw_dtype is not None and t.dtype == torch.uint8:
        name = raw_dtype
    # stream=-1: no synchronization by the producer (the op runs on the stream we pass), so this
    # is safe during CUDA graph capture.
    capsule = t.__dlpack__(stream=-1) if t.is_cuda else t
    return (capsule, name) if name is not None else capsule


def _opt(t: Optional[torch.Tensor], raw_dtype: str | None = None):
    return None if t is None else _arg(t, raw_dtype)


def _stream(x: torch.Tensor, stream: int) -> int:
    if stream or not x.is_cuda:
        return stream
    return torch.cuda.current_stream(x.device).cuda_stream


class _on_device:
    """Makes x's CUDA device current for the call (the C++ library requires it)."""

    def __init__(self, x: torch.Tensor):
        self.guard = None
        if x.is_cuda and x.device.index is not None and x.device.index != torch.cuda.current_device():
            self.guard = torch.cuda.device(x.device.index)

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            return self.guard.__exit__(*exc)
        return False


# ---- custom ops ------------------------------------------------------------------------------

_IMPLS = {}


def _custom_op(name, mutates_args):
    """torch.library.custom_op that also keeps the plain implementation for the eager fast path."""

    def register(fn):
        _IMPLS[name.split("::")[1]] = fn
        return torch.library.custom_op(name, mutates_args=mutates_args)(fn)

    return register


def _run(name: str, *args):
    """Calls custom op `name`; in plain eager mode (no compile, no dispatch mode, plain tensors) it
    calls the implementation directly, skipping the dispatcher's ~30 us of Python overhead."""
    if (
        not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and all(type(a) is torch.Tensor for a in args if isinstance(a, torch.Tensor))
    ):
        _IMPLS[name](*args)
    else:
        getattr(torch.ops.fp8mla, name)(*args)


@_custom_op("fp8mla::quantize_fp8", mutates_args=("out",))
def _quantize_fp8(x: torch.Tensor, out: torch.Tensor, scale_inv: float, dtype: str, stream: int) -> None:
    with _on_device(x):
        _C.quantize_fp8(_arg(x), _arg(out, dtype), float(scale_inv), _stream(x, stream))


@_quantize_fp8.register_fake
def _(x, out, scale_inv, dtype, stream):
    return None


@_custom_op("fp8mla::quantize_fp8_scale_tensor", mutates_args=("out",))
def _quantize_fp8_scale_tensor(
    x: torch.Tensor, out: torch.Tensor, scale_inv: torch.Tensor, dtype: str, stream: int
) -> None:
    with _on_device(x):
        _C.quantize_fp8(_arg(x), _arg(out, dtype), _arg(scale_inv), _stream(x, stream))


@_quantize_fp8_scale_tensor.register_fake
def _(x, out, scale_inv, dtype, stream):
    return None


@_custom_op("fp8mla::quantize_fp8_dynamic", mutates_args=("out", "scale"))
def _quantize_fp8_dynamic(
    x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, dtype: str, stream: int
) -> None:
    with _on_device(x):
        _C.quantize_fp8_dynamic(_arg(x), _arg(out, dtype), _arg(scale), _stream(x, stream))


@_quantize_fp8_dynamic.register_fake
def _(x, out, scale, dtype, stream):
    return None


@_custom_op("fp8mla::quantize_fp8_per_token_group", mutates_args=("out", "scales"))
def _quantize_fp8_per_token_group(
    x: torch.Tensor,
    out: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    eps: float,
    round_scale_to_pow2: bool,
    stream: int,
) -> None:
    with _on_device(x):
        _C.quantize_fp8_per_token_group(
            _arg(x), _arg(out, "e4m3"), _arg(scales, "ue8m0"), group_size, eps,
            round_scale_to_pow2, _stream(x, stream),
        )


@_quantize_fp8_per_token_group.register_fake
def _(x, out, scales, group_size, eps, round_scale_to_pow2, stream):
    return None


@_custom_op("fp8mla::quantize_nvfp4", mutates_args=("out", "block_scales"))
def _quantize_nvfp4(
    x: torch.Tensor,
    out: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor,
    layout: str,
    stream: int,
) -> None:
    with _on_device(x):
        _C.quantize_nvfp4(
            _arg(x), _arg(out, "e2m1x2"), _arg(block_scales, "e4m3"), _arg(global_scale),
            layout, _stream(x, stream),
        )


@_quantize_nvfp4.register_fake
def _(x, out, block_scales, global_scale, layout, stream):
    return None


@_custom_op("fp8mla::make_cos_sin_cache", mutates_args=("cos_sin",))
def _make_cos_sin_cache(
    cos_sin: torch.Tensor, rope_dim: int, theta: float, yarn: Optional[List[float]], stream: int
) -> None:
    yarn_args = None
    if yarn is not None:
        yarn_args = (yarn[0], int(yarn[1]), yarn[2], yarn[3], yarn[4], yarn[5])
    with _on_device(cos_sin):
        if cos_sin.is_cuda:
            # The library fills a CUDA table by a blocking copy outside torch's streams: first let
            # queued work (e.g. the previous user of cos_sin's memory) finish. Set-up work only.
            torch.cuda.synchronize(cos_sin.device)
        _C.make_cos_sin_cache(_arg(cos_sin), rope_dim, theta, yarn_args, _stream(cos_sin, stream))


@_make_cos_sin_cache.register_fake
def _(cos_sin, rope_dim, theta, yarn, stream):
    return None


@_custom_op(
    "fp8mla::mla_rope_quantize_fp8", mutates_args=("q_out", "k_out", "cache", "error_flag")
)
def _mla_rope_quantize_fp8(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    style: str,
    q_scale_inv: float,
    k_scale_inv: float,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    kv_c: Optional[torch.Tensor],
    cache: Optional[torch.Tensor],
    slot_mapping: Optional[torch.Tensor],
    cache_scale_inv: float,
    error_flag: Optional[torch.Tensor],
    stream: int,
) -> None:
    with _on_device(q_nope):
        _C.mla_rope_quantize_fp8(
            _arg(q_nope), _arg(q_pe), _arg(k_nope), _arg(k_pe), _arg(positions), _arg(cos_sin),
            style, q_scale_inv, k_scale_inv, _arg(q_out, "e4m3"), _arg(k_out, "e4m3"),
            _opt(kv_c), _opt(cache, "e4m3"), _opt(slot_mapping), cache_scale_inv,
            _opt(error_flag), _stream(q_nope, stream),
        )


@_mla_rope_quantize_fp8.register_fake
def _(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, style, q_scale_inv, k_scale_inv, q_out,
      k_out, kv_c, cache, slot_mapping, cache_scale_inv, error_flag, stream):
    return None


@_custom_op("fp8mla::mla_kv_cache_write", mutates_args=("cache", "error_flag"))
def _mla_kv_cache_write(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale_inv: float,
    error_flag: Optional[torch.Tensor],
    stream: int,
) -> None:
    with _on_device(kv_c):
        _C.mla_kv_cache_write(_arg(kv_c), _arg(k_pe), _arg(cache, "e4m3"), _arg(slot_mapping),
                              scale_inv, _opt(error_flag), _stream(kv_c, stream))


@_mla_kv_cache_write.register_fake
def _(kv_c, k_pe, cache, slot_mapping, scale_inv, error_flag, stream):
    return None


@_custom_op("fp8mla::mla_kv_gather", mutates_args=("kv_c_out", "k_pe_out", "error_flag"))
def _mla_kv_gather(
    cache: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    kv_c_out: torch.Tensor,
    k_pe_out: torch.Tensor,
    error_flag: Optional[torch.Tensor],
    stream: int,
) -> None:
    with _on_device(cache):
        _C.mla_kv_gather(_arg(cache, "e4m3"), _arg(slots), scale, _arg(kv_c_out), _arg(k_pe_out),
                         _opt(error_flag), _stream(cache, stream))


@_mla_kv_gather.register_fake
def _(cache, slots, scale, kv_c_out, k_pe_out, error_flag, stream):
    return None


@_custom_op("fp8mla::mla_kv_pack_quantize_fp8", mutates_args=("k_out", "v_out"))
def _mla_kv_pack_quantize_fp8(
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    k_scale_inv: float,
    v_scale_inv: float,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    v_layout: str,
    stream: int,
) -> None:
    with _on_device(k_nope):
        _C.mla_kv_pack_quantize_fp8(_arg(k_nope), _arg(k_pe), _arg(v), k_scale_inv, v_scale_inv,
                                    _arg(k_out, "e4m3"), _arg(v_out, "e4m3"), v_layout,
                                    _stream(k_nope, stream))


@_mla_kv_pack_quantize_fp8.register_fake
def _(k_nope, k_pe, v, k_scale_inv, v_scale_inv, k_out, v_out, v_layout, stream):
    return None


@_custom_op("fp8mla::mla_v_quantize_fp8", mutates_args=("v_out",))
def _mla_v_quantize_fp8(
    v: torch.Tensor, v_scale_inv: float, v_out: torch.Tensor, v_layout: str, stream: int
) -> None:
    with _on_device(v):
        _C.mla_v_quantize_fp8(_arg(v), v_scale_inv, _arg(v_out, "e4m3"), v_layout,
                              _stream(v, stream))


@_mla_v_quantize_fp8.register_fake
def _(v, v_scale_inv, v_out, v_layout, stream):
    return None


@_custom_op("fp8mla::prefill_attention", mutates_args=("out", "lse"))
def _prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    q_descale: Optional[torch.Tensor],
    k_descale: Optional[torch.Tensor],
    v_descale: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: Optional[torch.Tensor],
    stream: int,
) -> None:
    opt = lambda t: None if t is None else _arg(t)  # noqa: E731
    with _on_device(q):
        _C.prefill_attention(_arg(q), _arg(k), _arg(v), _arg(cu_seqlens_q), _arg(cu_seqlens_k),
                             max_seqlen_q, max_seqlen_k, softmax_scale, causal, opt(q_descale),
                             opt(k_descale), opt(v_descale), _arg(out), opt(lse),
                             _stream(q, stream))


@_prefill_attention.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      q_descale, k_descale, v_descale, out, lse, stream):
    return None


@_custom_op("fp8mla::merge_attention_states", mutates_args=("out", "out_lse"))
def _merge_attention_states(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    out: torch.Tensor,
    out_lse: torch.Tensor,
    stream: int,
) -> None:
    with _on_device(o_a):
        _C.merge_attention_states(_arg(o_a), _arg(lse_a), _arg(o_b), _arg(lse_b), _arg(out),
                                  _arg(out_lse), _stream(o_a, stream))


@_merge_attention_states.register_fake
def _(o_a, lse_a, o_b, lse_b, out, out_lse, stream):
    return None


# ---- front end: allocate outputs, call the custom ops -----------------------------------------


def quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3", stream=None):
    check_choice("quantize_fp8", "dtype", dtype, FP8_DTYPES)
    if out is None:
        out = torch.empty(x.shape, dtype=FP8_TORCH_DTYPES[dtype], device=x.device)
    if isinstance(scale_inv, torch.Tensor):
        _run("quantize_fp8_scale_tensor", x, out, scale_inv, dtype, stream or 0)
    else:
        _run("quantize_fp8", x, out, float(scale_inv), dtype, stream or 0)
    return out


def quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3", stream=None):
    check_choice("quantize_fp8_dynamic", "dtype", dtype, FP8_DTYPES)
    if out is None:
        out = torch.empty(x.shape, dtype=FP8_TORCH_DTYPES[dtype], device=x.device)
    if scale is None:
        scale = torch.empty((1,), dtype=torch.float32, device=x.device)
    _run("quantize_fp8_dynamic", x, out, scale, dtype, stream or 0)
    return out, scale


def quantize_fp8_per_token_group(
    x,
    *,
    group_size=128,
    eps=1e-10,
    scale_layout="row_major",
    round_scale_to_pow2=False,
    out=None,
    scales=None,
    stream=None,
):
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if scales is None:
        check_choice("quantize_fp8_per_token_group", "scale_layout", scale_layout, SCALE_LAYOUTS)
        kind, shape, transpose, rows = group_scale_plan(tuple(x.shape), group_size, scale_layout)
        dtype = {"f32": torch.float32, "ue8m0": UE8M0_TORCH_DTYPE, "i32": torch.int32}[kind]
        scales = torch.empty(shape, dtype=dtype, device=x.device)
        if transpose:
            scales = scales[:, :rows].t()
    _run(
        "quantize_fp8_per_token_group",
        x, out, scales, group_size, float(eps), bool(round_scale_to_pow2), stream or 0
    )
    return out, scales


def quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None, stream=None):
    check_choice("quantize_nvfp4", "layout", layout, NVFP4_LAYOUTS)
    out_shape, scales_shape = nvfp4_shapes(tuple(x.shape), layout)
    if out is None:
        out = torch.empty(out_shape, dtype=NVFP4_TORCH_DTYPE, device=x.device)
    if block_scales is None:
        block_scales = torch.empty(scales_shape, dtype=torch.float8_e4m3fn, device=x.device)
    if not isinstance(global_scale, torch.Tensor):
        global_scale = torch.full((1,), float(global_scale), dtype=torch.float32, device=x.device)
    _run("quantize_nvfp4", x, out, block_scales, global_scale, layout, stream or 0)
    return out, block_scales


def make_cos_sin_cache(max_pos, *, rope_dim=64, theta=10000.0, yarn=None, device=None, out=None,
                       stream=None):
    yarn = yarn_tuple("make_cos_sin_cache", yarn)
    if out is None:
        out = torch.empty((max_pos, rope_dim), dtype=torch.float32,
                          device=torch.device("cpu") if device is None else device)
    _run("make_cos_sin_cache", out, int(rope_dim), float(theta),
         None if yarn is None else [float(v) for v in yarn], stream or 0)
    return out


def mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, *, style="interleaved",
                          q_scale_inv=1.0, k_scale_inv=1.0, q_out=None, k_out=None, kv_c=None,
                          cache=None, slot_mapping=None, cache_scale_inv=1.0, error_flag=None,
                          stream=None):
    if q_out is None:
        q_out = torch.empty(out_shape(q_nope.shape, MLA["qk"]), dtype=torch.float8_e4m3fn,
                            device=q_nope.device)
    if k_out is None:
        k_out = torch.empty(out_shape(k_nope.shape, MLA["qk"]), dtype=torch.float8_e4m3fn,
                            device=k_nope.device)
    _run("mla_rope_quantize_fp8", q_nope, q_pe, k_nope, k_pe, positions, cos_sin, style,
         float(q_scale_inv), float(k_scale_inv), q_out, k_out, kv_c, cache, slot_mapping,
         float(cache_scale_inv), error_flag, stream or 0)
    return q_out, k_out


def mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, *, scale_inv=1.0, error_flag=None,
                       stream=None):
    _run("mla_kv_cache_write", kv_c, k_pe, cache, slot_mapping, float(scale_inv), error_flag,
         stream or 0)


def mla_kv_gather(cache, slots, scale, *, kv_c_out=None, k_pe_out=None, error_flag=None,
                  stream=None):
    n = gather_rows(tuple(slots.shape))
    if kv_c_out is None:
        kv_c_out = torch.empty((n, MLA["kv_lora_rank"]), dtype=torch.bfloat16, device=cache.device)
    if k_pe_out is None:
        k_pe_out = torch.empty((n, MLA["rope"]), dtype=torch.bfloat16, device=cache.device)
    _run("mla_kv_gather", cache, slots, float(scale), kv_c_out, k_pe_out, error_flag, stream or 0)
    return kv_c_out, k_pe_out


def _v_out(v, v_layout):
    """A new e4m3 V output like v [n, H, 128] on v's device in `v_layout` ("transposed": a
    [n, H, 128] view of [H, 128, pitch] memory)."""
    if v_layout == "transposed":
        n, heads, dim = v.shape
        return torch.empty((heads, dim, transposed_pitch(n)), dtype=torch.float8_e4m3fn,
                           device=v.device)[:, :, :n].permute(2, 0, 1)
    return torch.empty(tuple(v.shape), dtype=torch.float8_e4m3fn, device=v.device)


def mla_kv_pack_quantize_fp8(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0, k_out=None,
                             v_out=None, v_layout="token_major", stream=None):
    check_choice("mla_kv_pack_quantize_fp8", "v_layout", v_layout, V_LAYOUTS)
    if k_out is None:
        k_out = torch.empty(out_shape(k_nope.shape, MLA["qk"]), dtype=torch.float8_e4m3fn,
                            device=k_nope.device)
    if v_out is None:
        v_out = _v_out(v, v_layout)
    _run("mla_kv_pack_quantize_fp8", k_nope, k_pe, v, float(k_scale_inv), float(v_scale_inv),
         k_out, v_out, v_layout, stream or 0)
    return k_out, v_out


def mla_v_quantize_fp8(v, *, v_scale_inv=1.0, v_out=None, v_layout="token_major", stream=None):
    check_choice("mla_v_quantize_fp8", "v_layout", v_layout, V_LAYOUTS)
    if v_out is None:
        v_out = _v_out(v, v_layout)
    _run("mla_v_quantize_fp8", v, float(v_scale_inv), v_out, v_layout, stream or 0)
    return v_out


def prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                      softmax_scale, causal=True, q_descale=None, k_descale=None, v_descale=None,
                      out=None, lse=None, return_lse=False, stream=None):
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=torch.bfloat16,
                          device=q.device)
    if lse is None and return_lse:
        lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    _run("prefill_attention", q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
         int(max_seqlen_k), float(softmax_scale), bool(causal), q_descale, k_descale, v_descale,
         out, lse, stream or 0)
    return (out, lse) if lse is not None else out


def merge_attention_states(o_a, lse_a, o_b, lse_b, *, out=None, out_lse=None, stream=None):
    if out is None:
        out = torch.empty_like(o_a)
    if out_lse is None:
        out_lse = torch.empty(tuple(lse_a.shape), dtype=torch.float32, device=lse_a.device)
    _run("merge_attention_states", o_a, lse_a, o_b, lse_b, out, out_lse, stream or 0)
    return out, out_lse


# fp8mla.quantize_* route torch tensors here from now on (also when this module was imported
# directly, before any torch tensor reached them).
import sys as _sys  # noqa: E402

_sys.modules[__package__]._torch_ops = _sys.modules[__name__]
