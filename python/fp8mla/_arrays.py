"""Array adapters: how one framework's arrays meet the op table (_ops.py) and _C.

An adapter (a subclass of Arrays) allocates outputs (`empty`, `empty_like`, `empty_as`;
`as_strided`, a view of a shape and element strides from an allocation's start, and
`empty_view`, such a view of a new allocation, for the transposed layouts; `empty_group`, a
call's several outputs at once from the specs Plan's methods of the same names give), makes
one-element f32 scalars (`scalar`), says what is an array (`is_array`), converts an array for _C
(`tensor`) and runs an op (`call`, or `query` for an op that returns a value, `run_layer` for an
MlaLayer method that has a torch op); `require` sees the outputs about to be allocated (other
DLPack arrays cannot be).
Here: numpy (CPU; bf16 and fp8 through ml_dtypes) and other DLPack arrays (cupy, jax, ...:
passed through as they are, every output given). torch's adapter is in torch_ops.py, which
also registers the torch custom ops.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _C
from ._common import invalid_argument

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is optional
    ml_dtypes = None


class Arrays:
    """The adapter interface, and what the numpy and torch adapters share."""

    array_type: type = object

    @classmethod
    def is_array(cls, value) -> bool:
        return isinstance(value, cls.array_type)

    @classmethod
    def empty_as(cls, like, dtype):
        """A row-major array of `like`'s shape and device in the fp8mla format `dtype`."""
        return cls.empty(tuple(like.shape), dtype, like)

    @classmethod
    def empty_view(cls, shape, dtype, like, view_shape, view_strides):
        """The view (`as_strided`) of a new row-major allocation of `shape`."""
        return cls.as_strided(cls.empty(shape, dtype, like), view_shape, view_strides)

    @staticmethod
    def groups() -> bool:
        """Whether empty_group allocates a call's outputs together now (otherwise the op
        allocates each output through its own method, without the detour through specs)."""
        return False

    @classmethod
    def empty_group(cls, specs):
        """The outputs of one call, from Plan's specs, each allocated as its method would (an
        adapter may put them in one allocation)."""
        return tuple(cls.empty_spec(*spec) for spec in specs)

    @classmethod
    def empty_spec(cls, like, dtype, shape, view_shape, view_strides):
        if dtype is None:
            return cls.empty_like(like)
        if shape is None:
            return cls.empty_as(like, dtype)
        if view_shape is None:
            return cls.empty(shape, dtype, like)
        return cls.empty_view(shape, dtype, like, view_shape, view_strides)

    @staticmethod
    def require(op_name, **missing):
        """Called with the outputs about to be allocated (True: missing) before allocating."""

    @classmethod
    def call(cls, op, values, stream):
        """Runs op on `values`, its arguments as the torch op takes them (outputs allocated)."""
        getattr(_C, op.name)(*op.c_args(cls.tensor, *values), stream)

    @staticmethod
    def run_layer(layer, method, values):
        """Runs MlaLayer method `method` on `values` (its torch op's arguments after the layer's
        number): layer._<method>(*values)."""
        getattr(layer, "_" + method)(*values)

    @classmethod
    def query(cls, op, values):
        """Runs query `op` (metadata only: no stream, no outputs) and returns its result."""
        return getattr(_C, op.name)(*op.c_args(cls.tensor, *values))


class Plan:
    """The allocation methods of an adapter, answering with what they would allocate: a spec
    (like, dtype, shape, view_shape, view_strides) for Arrays.empty_group, which allocates a
    call's outputs together. An op's allocation rules run on it when every output is missing."""

    @staticmethod
    def empty(shape, dtype, like):
        return (like, dtype, shape, None, None)

    @staticmethod
    def empty_as(like, dtype):
        return (like, dtype, None, None, None)

    @staticmethod
    def empty_like(like):
        return (like, None, None, None, None)

    @staticmethod
    def empty_view(shape, dtype, like, view_shape, view_strides):
        return (like, dtype, shape, view_shape, view_strides)


class Numpy(Arrays):
    """numpy has no bfloat16 / float8 types of its own: ml_dtypes arrays are passed to _C as
    same-size integer views with the fp8mla dtype named, and outputs are allocated with ml_dtypes
    types when ml_dtypes is installed (uint8 / uint16 otherwise)."""

    # fp8mla dtype -> allocated numpy dtype; the plain unsigned storage an array given for it
    # may be (raw bytes / bits); numpy dtype -> (fp8mla dtype, integer view) for the types
    # numpy's DLPack cannot export.
    STORAGE = {"e4m3": np.uint8, "e5m2": np.uint8, "ue8m0": np.uint8, "e2m1x2": np.uint8,
               "bf16": np.uint16, "f32": np.float32, "i32": np.int32}
    RAW = {"e4m3": np.uint8, "e5m2": np.uint8, "ue8m0": np.uint8, "e2m1x2": np.uint8,
           "bf16": np.uint16}
    VIEWS: dict = {}
    if ml_dtypes is not None:
        STORAGE.update(e4m3=ml_dtypes.float8_e4m3fn, e5m2=ml_dtypes.float8_e5m2,
                       bf16=ml_dtypes.bfloat16)
        VIEWS = {np.dtype(ml_dtypes.bfloat16): ("bf16", np.uint16),
                 np.dtype(ml_dtypes.float8_e4m3fn): ("e4m3", np.uint8),
                 np.dtype(ml_dtypes.float8_e5m2): ("e5m2", np.uint8)}
        if hasattr(ml_dtypes, "float8_e8m0fnu"):
            STORAGE["ue8m0"] = ml_dtypes.float8_e8m0fnu
            VIEWS[np.dtype(ml_dtypes.float8_e8m0fnu)] = ("ue8m0", np.uint8)

    array_type = np.ndarray
    empty_like = staticmethod(np.empty_like)

    @staticmethod
    def as_strided(a, shape, strides):
        # A view whose base is `a` (as a slice and transpose of it would be).
        return np.ndarray(shape, a.dtype, buffer=a, strides=tuple(s * a.itemsize for s in strides))

    @staticmethod
    def empty(shape, dtype, like):
        return np.empty(shape, dtype=Numpy.STORAGE[dtype])

    @staticmethod
    def scalar(value, like):
        return np.array([value], dtype=np.float32)

    @staticmethod
    def tensor(a, raw_dtype=None):
        """The argument _C takes for `a`: the array, or (integer view, fp8mla dtype name)."""
        if not isinstance(a, np.ndarray):
            return a
        view = Numpy.VIEWS.get(a.dtype)
        if view is not None:
            return (a.view(view[1]), view[0])
        if raw_dtype is not None and a.dtype == Numpy.RAW.get(raw_dtype):
            return (a, raw_dtype)
        return a


class DLPack(Arrays):
    """Other DLPack arrays: passed through as they are; outputs must be given."""

    @staticmethod
    def is_array(value) -> bool:
        return not isinstance(value, (int, float))

    @staticmethod
    def scalar(value, like):
        return value  # _C says it wants an array

    @staticmethod
    def require(op_name, **missing):
        names = [name for name, is_missing in missing.items() if is_missing]
        raise TypeError(
            f"fp8mla.{op_name}: allocating outputs is supported for torch and numpy arrays; "
            f"pass {', '.join(names)} explicitly")

    @staticmethod
    def tensor(a, raw_dtype=None):
        # uint8 / uint16 arrays hold the bytes of the format the op table names (cupy has no
        # float8 or bfloat16 dtypes): _C views them as that format.
        if raw_dtype is not None and str(getattr(a, "dtype", "")) in ("uint8", "uint16"):
            return (a, raw_dtype)
        return a


class NotAnArray(DLPack):
    """The adapter of a value that is no array at all (a list, None, a string): _C says so where
    it meets it; an output to allocate is refused here, naming what was given."""

    given = "?"

    @classmethod
    def require(cls, op_name, **missing):
        raise TypeError(
            f"fp8mla.{op_name}: expected a numpy array, a torch tensor or an array with "
            f"__dlpack__ for the tensor arguments, got {cls.given}")


def _not_an_array(x) -> bool:
    if hasattr(x, "__dlpack__"):
        return False
    try:
        memoryview(x)
    except TypeError:
        return True
    return False


_BY_MODULE = {"numpy": Numpy}
_BY_TYPE: dict = {}  # array type -> its adapter, as adapter_for found it
# torch.Tensor and its adapter once torch_ops is loaded. A plain tensor is routed by them without
# reading _BY_TYPE: torch.compile guards on what a traced function reads, and a guard on that
# cache would recompile every graph each time another array type reached fp8mla.
_TORCH_TENSOR = _TORCH_ADAPTER = None


def load_torch():
    """Imports torch_ops (registering the custom ops) and routes torch tensors to it."""
    global _TORCH_TENSOR, _TORCH_ADAPTER
    from . import torch_ops

    _BY_MODULE["torch"] = torch_ops.Torch
    _TORCH_TENSOR, _TORCH_ADAPTER = torch_ops.torch.Tensor, torch_ops.Torch
    return torch_ops.Torch


def adapter_for(x):
    """The adapter of array x, by the top-level module of its type or, for a subclass of
    torch.Tensor defined elsewhere, torch's (looked up once per type)."""
    if type(x) is _TORCH_TENSOR:
        return _TORCH_ADAPTER
    adapter = _BY_TYPE.get(type(x))
    if adapter is None:
        root = type(x).__module__.partition(".")[0]
        adapter = _BY_MODULE.get(root)
        if adapter is None:
            torch = sys.modules.get("torch")
            is_tensor = root == "torch" or (torch is not None and isinstance(x, torch.Tensor))
            if is_tensor:
                adapter = load_torch()
            elif _not_an_array(x):
                adapter = type("NotAnArray", (NotAnArray,), {"given": type(x).__name__})
            else:
                adapter = DLPack
        _BY_TYPE[type(x)] = adapter
    return adapter


def adapter_for_device(device):
    """make_cos_sin_cache without `out`: numpy for device None, torch otherwise (numpy for "cpu"
    where torch is not installed)."""
    if device is None:
        return Numpy
    try:
        return load_torch()
    except ImportError:
        if str(device) != "cpu":
            raise invalid_argument(f"make_cos_sin_cache: device {device!r} needs torch") from None
        return Numpy
