"""The torch adapter: each op of the table (_ops.py) is a torch.library custom op
torch.ops.fp8mla.<op> with a fake implementation, so it works under torch.compile(fullgraph=True)
and CUDA graph capture. Importing this module registers them (fp8mla does when torch is imported
first, or when the first torch tensor arrives).

The public functions of fp8mla call the op's implementation directly in plain eager mode (not
compiling, no dispatch mode, plain torch.Tensor arguments), which skips the dispatcher's tens of
microseconds of Python; otherwise they call torch.ops.fp8mla.<op>. Either way the implementation
is one generated function per op (print _DIRECT_SOURCES[name] to read one) that hands the tensors
to _C as they are (_C reads torch tensors directly) on the device and current stream of the first
tensor.

A custom op takes the op's arguments in the table's order (the C++ API's), outputs included
(the caller allocates them; the public functions of fp8mla do, with torch.empty on the input's
device), writes into them and returns nothing; its schema marks them mutated. An op with a
float-or-tensor scale has a twin <op>_scale_tensor taking the tensor. `stream` 0 means torch's
current stream on the first tensor's device. Print torch.ops.fp8mla.<op>.default._schema for one.
"""

from __future__ import annotations

import torch

from . import _C
from ._arrays import Arrays
from ._common import invalid_argument
from ._ops import BACKEND_OPS, OPS
from ._spec import (
    BOOL,
    DTYPE,
    FLOAT,
    INT,
    MUTATED_KINDS,
    SCALE,
    STR,
    TENSOR_KINDS,
    YARN,
)

# The dtypes of allocated outputs.
_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "bf16": torch.bfloat16,
           "f32": torch.float32, "i32": torch.int32,
           "ue8m0": getattr(torch, "float8_e8m0fnu", torch.uint8),
           "e2m1x2": getattr(torch, "float4_e2m1fn_x2", torch.uint8)}

# _C reads torch tensors directly (data pointer, shape, strides, dtype, device: no DLPack export;
# python/src/torch_tensors.hpp says how), and allocates outputs of these dtypes by name.
_C.use_torch(torch, _DTYPES)
# fp8mla dtypes a plain uint8 tensor given for an argument may hold (raw bytes).
_RAW_BYTES = ("e4m3", "e5m2", "ue8m0", "e2m1x2")
_UINT8 = torch.uint8
_TENSOR = torch.Tensor
_CONTIGUOUS = torch.contiguous_format
# Outputs allocated by libtorch from C++ (python/src/torch_tensors.hpp), about half of torch's
# own allocation's host time, where _C found torch's functions for it; None: torch allocates.
_TORCH_EMPTY = _C.torch_empty if _C.torch_allocator() in ("shim", "grouped") else None
# A call's several outputs in one allocation (one caching-allocator call and one free instead of
# one each); None: one allocation per output.
_TORCH_EMPTY_GROUP = _C.torch_empty_group if _C.torch_allocator() == "grouped" else None
# _C runs an op with torch's CUDA tensors on torch's current stream and device itself
# (python/src/torch_cuda_context.hpp), where this torch has the functions for it.
_TORCH_CUDA_CONTEXT = _C.torch_cuda_context()
_IS_COMPILING = torch.compiler.is_compiling
_DISPATCH_MODES = torch._C._len_torch_dispatch_stack


def _c_empty(like, dtype, shape=None, view_shape=None, view_strides=None):
    """_C.torch_empty's tensor in plain eager mode, else None (torch allocates): traced or under a
    dispatch mode, torch's allocation is what the mode must see."""
    if _TORCH_EMPTY is None or _IS_COMPILING() or _DISPATCH_MODES():
        return None
    return _TORCH_EMPTY(like, dtype, shape, view_shape, view_strides)


def _tensor(t: torch.Tensor, raw_dtype: str | None = None):
    """The argument _C takes for tensor `t`: `t`, or (t, fp8mla dtype name) for raw bytes."""
    if t.dtype is _UINT8 and raw_dtype in _RAW_BYTES:
        return (t, raw_dtype)
    return t


# ---- custom ops ----------------------------------------------------------------------------------

# Integers are SymInt: under torch.compile a value that changes between calls (an engine's
# max_seqlen per batch) stays symbolic instead of recompiling the graph for each value.
_SCHEMA_TYPES = {FLOAT: "float", INT: "SymInt", BOOL: "bool", STR: "str", DTYPE: "str",
                 YARN: "float[]?"}


def _schema(op, scale_type: str) -> str:
    """The op's schema, e.g. "(Tensor x, Tensor(a!) out, float scale_inv, str dtype, int stream)
    -> ()"; each mutated tensor gets its own alias set."""
    params, alias_sets = [], iter("abcdefghijklmnopqrstuvwxyz")
    for a in op.schema_args:
        if a.kind in TENSOR_KINDS:
            mutated = f"({next(alias_sets)}!)" if a.kind in MUTATED_KINDS else ""
            optional = "?" if a.optional else ""
            params.append(f"Tensor{mutated}{optional} {a.name}")
        else:
            params.append(f"{scale_type if a.kind == SCALE else _SCHEMA_TYPES[a.kind]} {a.name}")
    return f"({', '.join(params + ['int stream'])}) -> ()"


# ---- the implementation and the eager entry, generated per op -----------------------------------

def _raw_bytes(t: torch.Tensor, raw_dtype: str):
    """(t, raw_dtype) for uint8 bytes the table names a format for, t otherwise."""
    return (t, raw_dtype) if raw_dtype in _RAW_BYTES else t


def _call_lines(op) -> list:
    """The body of the op's implementation: _C called on the first tensor's device and stream
    (0: torch's current stream there). _C resolves both itself where it found torch's functions
    for it (_TORCH_CUDA_CONTEXT); an op that fills memory from the host synchronizes here first."""
    values = ", ".join(op.c_values(lambda name, raw: name if raw == "None" else (
        f"({name} if {name}.dtype is not _UINT8 else _raw_bytes({name}, {raw}))")))
    if _TORCH_CUDA_CONTEXT and not op.host_fill:
        return [f"    _c_op({values}, stream)"]
    first = op.first_tensor.name
    lines = [f"    if {first}.is_cuda:",
             f"        device = {first}.get_device()",
             "        if not stream:",
             "            stream = _current_stream(device)"]
    if op.host_fill:
        # The library fills this CUDA memory by a blocking copy outside torch's streams: first
        # let queued work (e.g. the previous user of the memory) finish.
        lines.append("        _synchronize(device)")
    # The C++ library runs on the current device.
    return lines + ["        if device != _current_device():",
                    "            with _cuda_device(device):",
                    f"                return _c_op({values}, stream)",
                    f"    _c_op({values}, stream)"]


def _direct_source(op) -> str:
    """The op's implementation, the kernel of its custom op (its parameters, then `stream`)."""
    params = ", ".join(a.name for a in op.schema_args)
    return "\n".join([f"def direct({params}, stream):", *_call_lines(op)]) + "\n"


def _eager_source(op) -> str:
    """The entry of Torch.call: in plain eager mode the implementation's body, inline; otherwise
    the custom op."""
    params = ", ".join(a.name for a in op.schema_args)
    plain = ["not _is_compiling()", "not _dispatch_modes()"]
    for a in op.schema_args:
        if a.kind == SCALE:
            plain.append(f"({a.name}.__class__ is float or {a.name}.__class__ is _Tensor)")
        elif a.kind in TENSOR_KINDS:
            plain.append(f"({a.name} is None or {a.name}.__class__ is _Tensor)" if a.optional
                         else f"{a.name}.__class__ is _Tensor")
    custom = "_custom"
    if op.scale is not None:
        scale = op.schema_args[op.scale].name
        # isinstance, not __class__: this line is also traced by torch.compile.
        custom = f"(_custom if isinstance({scale}, float) else _custom_scale_tensor)"
    condition = "\n            and ".join(plain)
    # The custom op takes UE8M0 tensors as their bytes: Inductor (torch 2.11) fails on a graph
    # passing a float8_e8m0fnu tensor to a custom op, and takes a uint8 view of it.
    tensors = [a.name for a in op.schema_args if a.kind in TENSOR_KINDS]
    as_bytes = [f"        {name} = _e8m0_bytes({name})" for name in tensors]
    return "\n".join(["def eager(values, stream):",
                      f"    ({params},) = values",
                      f"    if not ({condition}):",
                      *as_bytes,
                      f"        return {custom}({params}, stream)",
                      *_call_lines(op)]) + "\n"


_E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _e8m0_bytes(t):
    """A float8_e8m0fnu tensor as its uint8 view (the same bytes), anything else as it is."""
    return t.view(_UINT8) if t is not None and t.dtype is _E8M0 else t


_SCOPE = {"_UINT8": _UINT8, "_Tensor": torch.Tensor, "_raw_bytes": _raw_bytes,
          "_e8m0_bytes": _e8m0_bytes,
          # torch's C functions behind torch.cuda.current_stream / current_device (CUDA builds).
          "_current_stream": getattr(torch._C, "_cuda_getCurrentRawStream", None),
          "_current_device": getattr(torch._C, "_cuda_getDevice", None),
          "_cuda_device": torch.cuda.device, "_synchronize": torch.cuda.synchronize,
          "_is_compiling": torch.compiler.is_compiling,
          "_dispatch_modes": torch._C._len_torch_dispatch_stack}


def _fake(*values):
    return None  # every op writes into its arguments and returns nothing


_DIRECT_SOURCES = {}  # op name -> the source of its implementation
_EAGER = {}  # op name -> its entry from Torch.call
for _op in (*OPS, *BACKEND_OPS):
    if _op.query:
        continue  # metadata only, returns a value: called directly (Torch.query), not a graph op
    _DIRECT_SOURCES[_op.name] = _direct_source(_op)
    _direct = _op.compile("direct", _DIRECT_SOURCES[_op.name], _c_op=getattr(_C, _op.name),
                          **_SCOPE)
    _variants = {"_custom": (_op.name, "float")}
    if _op.scale is not None:
        _variants["_custom_scale_tensor"] = (_op.name + "_scale_tensor", "Tensor")
    _customs = {}
    for _key, (_name, _scale_type) in _variants.items():
        _custom = torch.library.custom_op(f"fp8mla::{_name}", _direct, mutates_args=_op.mutates,
                                          schema=_schema(_op, _scale_type))
        _custom.register_fake(_fake)
        _customs[_key] = getattr(torch.ops.fp8mla, _name)
    _EAGER[_op.name] = _op.compile("eager", _eager_source(_op), _c_op=getattr(_C, _op.name),
                                   **_customs, **_SCOPE)


# ---- MlaLayer.prefill_device_batch -----------------------------------------------------------
# A torch op too, so that torch.compile(fullgraph=True) and the dispatcher see a layer's prefill
# of a device batch: the layer is named by its number (MlaLayer.number), the rest are
# prefill_device_batch's arguments in order, `out` allocated (workspace None: the layer's own on
# CUDA, allocated when too small, as in eager mode; give it to capture a CUDA graph).
_LAYER_SCHEMA = ("(int layer, Tensor hidden, Tensor cu_seqlens_q, Tensor positions, "
                 "Tensor slot_mapping, Tensor(a!) cache, Tensor(b!) out, Tensor(c!)? workspace, "
                 "SymInt max_seqlen_q, Tensor? cu_seqlens_prefix, Tensor? prefix_slots, "
                 "SymInt max_seqlen_prefix, int one_shot_max_prefix, int chunk_capacity, "
                 "float cache_scale_inv, float q_scale_inv, float k_scale_inv, "
                 "float v_scale_inv, bool fuse_output_quant, bool fold_chunks, "
                 "bool fp8_kv_from_projection, int stream) -> ()")


def _layer_prefill_device_batch(layer, hidden, cu_seqlens_q, positions, slot_mapping, cache, out,
                                workspace, max_seqlen_q, cu_seqlens_prefix, prefix_slots,
                                max_seqlen_prefix, one_shot_max_prefix, chunk_capacity,
                                cache_scale_inv, q_scale_inv, k_scale_inv, v_scale_inv,
                                fuse_output_quant, fold_chunks, fp8_kv_from_projection, stream):
    from ._layer import _LAYERS

    target = _LAYERS.get(layer)
    if target is None:
        raise invalid_argument(f"mla_layer_prefill_device_batch: no live fp8mla.MlaLayer has "
                               f"number {layer}")
    target._prefill_device_batch(hidden, cu_seqlens_q, positions, slot_mapping, cache, out,
                                 workspace, max_seqlen_q, cu_seqlens_prefix, prefix_slots,
                                 max_seqlen_prefix, one_shot_max_prefix, chunk_capacity,
                                 cache_scale_inv, q_scale_inv, k_scale_inv, v_scale_inv,
                                 fuse_output_quant, fold_chunks, fp8_kv_from_projection, stream)


torch.library.custom_op("fp8mla::mla_layer_prefill_device_batch", _layer_prefill_device_batch,
                        mutates_args=("cache", "out", "workspace"),
                        schema=_LAYER_SCHEMA).register_fake(_fake)


class Torch(Arrays):
    """The adapter of _arrays.run for torch tensors: outputs on the first tensor's device."""

    array_type = torch.Tensor
    tensor = staticmethod(_tensor)
    as_strided = staticmethod(torch.as_strided)

    @staticmethod
    def is_array(value) -> bool:
        # A plain tensor without isinstance's subclass walk (a static method: no class binding).
        return value.__class__ is _TENSOR or isinstance(value, _TENSOR)

    @staticmethod
    def empty(shape, dtype, like):
        if isinstance(like, torch.Tensor):
            out = _c_empty(like, _DTYPES[dtype], shape)
            if out is not None:
                return out
            return like.new_empty(shape, dtype=_DTYPES[dtype])  # no torch.device made
        return torch.empty(shape, dtype=_DTYPES[dtype], device=like)

    @staticmethod
    def empty_like(like):
        # A row-major `like` (the usual merge input) is what torch.empty_like would make of it.
        out = _c_empty(like, like.dtype) if like.is_contiguous() else None
        return out if out is not None else torch.empty_like(like)

    @classmethod
    def empty_view(cls, shape, dtype, like, view_shape, view_strides):
        out = _c_empty(like, _DTYPES[dtype], shape, view_shape, view_strides)
        if out is not None:
            return out
        return super().empty_view(shape, dtype, like, view_shape, view_strides)

    @staticmethod
    def groups() -> bool:
        # Plain eager mode: traced or under a dispatch mode, torch's own allocations are what the
        # mode must see.
        return _TORCH_EMPTY_GROUP is not None and not _IS_COMPILING() and not _DISPATCH_MODES()

    @classmethod
    def empty_group(cls, specs):
        outputs = _TORCH_EMPTY_GROUP(specs)
        if outputs is not None:
            return outputs
        return super().empty_group(specs)  # one by one: what _C did not take

    @staticmethod
    def empty_as(like, dtype):
        if _IS_COMPILING():
            # Traced, empty_like (and new_empty of a torch.Size) read `like`'s sizes in the graph:
            # with dynamic shapes a use of an attention output that would keep the fusion pass
            # from fusing its quantization. A tuple of sizes is the graph's own symbols.
            return like.new_empty(tuple(like.shape), dtype=_DTYPES[dtype])
        out = _c_empty(like, _DTYPES[dtype])
        if out is not None:
            return out
        # empty_like takes no shape to parse: about half new_empty's host time.
        return torch.empty_like(like, dtype=_DTYPES[dtype], memory_format=_CONTIGUOUS)

    @staticmethod
    def scalar(value, like):
        return torch.full((1,), value, dtype=torch.float32, device=like.device)

    @staticmethod
    def call(op, values, stream):
        _EAGER[op.name](values, stream)

    @staticmethod
    def run_layer(layer, method, values):
        # Plain eager mode (the ops' eager entries test the same): the method itself, without
        # the dispatcher.
        if (not _IS_COMPILING() and not _DISPATCH_MODES()
                and all(v.__class__ is _TENSOR for v in values if isinstance(v, _TENSOR))):
            getattr(layer, "_" + method)(*values)
        else:
            getattr(torch.ops.fp8mla, "mla_layer_" + method)(layer.number, *values)
