"""The torch adapter: each op of the table (_ops.py) is a torch.library custom op
torch.ops.fp8mla.<op> with a fake implementation, so it works under torch.compile(fullgraph=True)
and CUDA graph capture. Importing this module registers them (fp8mla does when torch is imported
first, or when the first torch tensor arrives).

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
from ._ops import OPS
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

# _C reads torch tensors directly (data pointer, shape, strides, dtype, device: no DLPack export).
_C.use_torch(torch)

# The dtypes of allocated outputs.
_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "bf16": torch.bfloat16,
           "f32": torch.float32, "i32": torch.int32,
           "ue8m0": getattr(torch, "float8_e8m0fnu", torch.uint8),
           "e2m1x2": getattr(torch, "float4_e2m1fn_x2", torch.uint8)}
# fp8mla dtypes a plain uint8 tensor given for an argument may hold (raw bytes).
_RAW_BYTES = ("e4m3", "e5m2", "ue8m0", "e2m1x2")
_UINT8 = torch.uint8


def _tensor(t: torch.Tensor, raw_dtype: str | None = None):
    """The argument _C takes for tensor `t`: `t`, or (t, fp8mla dtype name) for raw bytes."""
    if t.dtype is _UINT8 and raw_dtype in _RAW_BYTES:
        return (t, raw_dtype)
    return t


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


# ---- custom ops ----------------------------------------------------------------------------------

_SCHEMA_TYPES = {FLOAT: "float", INT: "int", BOOL: "bool", STR: "str", DTYPE: "str",
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


def _impl(op):
    """The kernel of every device: converts the tensors and calls _C on the first tensor's
    device and stream."""
    c_op = getattr(_C, op.name)
    first = op.schema_args.index(op.first_tensor)

    def impl(*values):
        *values, stream = values
        x = values[first]
        with _on_device(x):
            if op.host_fill and x.is_cuda:
                # The library fills this CUDA memory by a blocking copy outside torch's streams:
                # first let queued work (e.g. the previous user of the memory) finish.
                torch.cuda.synchronize(x.device)
            c_op(*op.c_args(_tensor, *values), _stream(x, stream))

    impl.__name__ = op.name
    return impl


def _fake(*values):
    return None  # every op writes into its arguments and returns nothing


_IMPLS = {}  # custom op name -> its plain implementation, for the eager fast path
_OPS = {}  # custom op name -> torch.ops.fp8mla.<name>
for _op in OPS:
    if _op.query:
        continue  # metadata only, returns a value: called directly (Torch.query), not a graph op
    _variants = {_op.name: "float"}
    if _op.scale is not None:
        _variants[_op.name + "_scale_tensor"] = "Tensor"
    for _name, _scale_type in _variants.items():
        _IMPLS[_name] = _impl(_op)
        _custom = torch.library.custom_op(f"fp8mla::{_name}", _IMPLS[_name],
                                          mutates_args=_op.mutates,
                                          schema=_schema(_op, _scale_type))
        _custom.register_fake(_fake)
        _OPS[_name] = getattr(torch.ops.fp8mla, _name)


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
        _OPS[name](*args)


class Torch(Arrays):
    """The adapter of _arrays.run for torch tensors: outputs on the first tensor's device."""

    array_type = torch.Tensor
    tensor = staticmethod(_tensor)
    empty_like = staticmethod(torch.empty_like)
    permute = staticmethod(torch.permute)

    @staticmethod
    def empty(shape, dtype, like):
        device = like.device if isinstance(like, torch.Tensor) else like
        return torch.empty(shape, dtype=_DTYPES[dtype], device=device)

    @staticmethod
    def scalar(value, like):
        return torch.full((1,), value, dtype=torch.float32, device=like.device)

    @staticmethod
    def call(op, values, stream):
        name = op.name
        if op.scale is not None and isinstance(values[op.scale], torch.Tensor):
            name += "_scale_tensor"
        _run(name, *values, stream)
