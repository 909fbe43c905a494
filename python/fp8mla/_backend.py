"""The attention backends (fp8mla/attention_backend.hpp; docs/design.md section 4) for engines.

make_attention_backend(name) returns an AttentionBackend: its capabilities (a frozen dataclass),
check_backend, and the two optional methods an engine's MLA prefill calls once per layer and step,
prepare_prefill_qkv (the BF16 -> FP8 transition) and pack_prefix_chunk_kv. The C++ backends are
stateless and made once per name, as are these objects: each carries its name, and the methods
are the ops BACKEND_OPS of the op table (_ops.py) with the name as their first argument, so they
take numpy arrays and torch tensors like the other ops and are torch custom ops
(torch.ops.fp8mla.backend_prepare_prefill_qkv, ...).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from . import _C
from ._arrays import adapter_for
from ._common import MLA
from ._ops import BACKEND_OPS

_FUNCTIONS = {op.name: op.public_function(adapter_for) for op in BACKEND_OPS}


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend declares (fp8mla::BackendCapabilities)."""

    name: str
    attention_dtypes: tuple  # of q, k, v: "e4m3", "bf16"
    head_dims: tuple  # (Dqk, Dv) pairs
    min_page_size: int
    max_page_size: int
    # The output quantization keys its attention fuses, as detect_output_quant_key names them.
    output_quant: tuple
    architectures: tuple  # "cpu", "sm_90a", ...
    prepare_prefill_qkv: bool
    pack_prefix_chunk_kv: bool
    v_layout: str  # of the FP8 V the hook and the pack write: "token_major" or "transposed"
    # Its prefill_attention folds a prior state (prior_out / prior_lse) into its output.
    fold_prior_state: bool


def _device(device) -> tuple:
    """("cpu" | "cuda", ordinal) of "cpu", "cuda", "cuda:1" or a torch.device."""
    kind, _, index = str(device).partition(":")
    return kind, int(index) if index else 0


def _method(op_name: str, method_name: str):
    """The method calling op `op_name` with the backend's name first; its signature without it."""
    function = _FUNCTIONS[op_name]

    def method(self, *args, **kwargs):
        return function(self.name, *args, **kwargs)

    signature = inspect.signature(function)
    params = list(signature.parameters.values())
    method.__signature__ = signature.replace(
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                    *params[1:]])
    method.__name__ = method.__qualname__ = method_name
    method.__doc__ = function.__doc__
    return method


class AttentionBackend:
    """An fp8mla attention backend, by name (make_attention_backend)."""

    def __init__(self, name: str):
        caps = _C.backend_capabilities(name)  # an unknown name raises, listing the known ones
        self.name = caps["name"]
        self.capabilities = BackendCapabilities(**{
            key: tuple(tuple(v) if isinstance(v, tuple) else v for v in value)
            if isinstance(value, list) else value for key, value in caps.items()})

    def __repr__(self) -> str:
        return f"fp8mla.AttentionBackend({self.name!r})"

    def check_backend(self, *, attention_dtype="e4m3", head_dim_qk=MLA["qk"], head_dim_v=MLA["v"],
                      page_size=64, output_quant=None, prepare_prefill_qkv=False,
                      pack_prefix_chunk_kv=False, device="cpu") -> None:
        """Raises fp8mla.UnsupportedError naming the backend, the device, what was required, what
        the backend supports and what is missing, unless it serves these requirements on `device`
        ("cpu", "cuda" (ordinal 0), "cuda:N" or a torch.device). `attention_dtype` "e4m3" or
        "bf16"; `output_quant` None (bf16 output) or a key detect_output_quant_key returns."""
        kind, index = _device(device)
        _C.check_backend(self.name, attention_dtype, int(head_dim_qk), int(head_dim_v),
                         int(page_size), output_quant or "", bool(prepare_prefill_qkv),
                         bool(pack_prefix_chunk_kv), kind, index)

    prepare_prefill_qkv = _method("backend_prepare_prefill_qkv", "prepare_prefill_qkv")
    pack_prefix_chunk_kv = _method("backend_pack_prefix_chunk_kv", "pack_prefix_chunk_kv")


# One object per backend, made at import: make_attention_backend is a dict lookup, which
# torch.compile traces without a graph break.
_BACKENDS = {name: AttentionBackend(name) for name in _C.attention_backend_names()}


def make_attention_backend(name: str) -> AttentionBackend:
    """The backend `name`: "cpu", "cpu-bf16", "fp8-hopper" or "bf16-hopper"
    (attention_backend_names()); the same object for the same name. An unknown name raises
    fp8mla.InvalidArgumentError listing the known ones."""
    backend = _BACKENDS.get(name)
    return backend if backend is not None else AttentionBackend(name)


def attention_backend_names() -> list:
    """The names make_attention_backend knows."""
    return list(_C.attention_backend_names())


def check_backend(backend, **requirements) -> None:
    """backend.check_backend(**requirements) for an AttentionBackend or a backend's name."""
    if not isinstance(backend, AttentionBackend):
        backend = make_attention_backend(backend)
    backend.check_backend(**requirements)
