"""One MLA attention layer from Python (fp8mla/mla_layer.hpp; docs/design.md section 5).

    MlaConfig.preset(name) / mla_config(source) -> MlaConfig   (read-only fields)
    generate_mla_weights(config, format="bf16", seed=0) -> MlaWeights
    load_mla_weights(model_dir, layer, tensor_parallel=None) -> MlaWeights   (a Hugging Face
        model directory; tensor_parallel=(rank, size): that rank's shard, docs/parallelism.md)
    shard_mla_weights(weights, rank, size) -> MlaWeights   (rank's heads of the full weights)
    weights.save(path, layer=0)   (a safetensors file under that layer's tensor names)
    MlaLayer(config, weights, device="cpu", backend=None, communicator=None)
    layer.prefill(hidden, batch, cache, *, out=None, ...) -> out
    layer.prefill_context_parallel(hidden, cp_batch, communicator, cache, *, out=None, ...)
        -> out   (cp_batch: fp8mla.context_parallel_batch; docs/parallelism.md)
    layer.prefill_device_batch(hidden, cu_seqlens_q, positions, slot_mapping, cache, *,
        max_seqlen_q, out=None, ...) -> out   (a padded batch of new tokens, CUDA-graph safe;
        torch.compile sees it as torch.ops.fp8mla.mla_layer_prefill_device_batch)
    layer.calibrate(hidden, batch, *, headroom=2.0) -> MlaCalibration   (static FP8 scales)
    layer.prefill(..., **calibration.prefill_options())
    mla_prefill_reference(weights, hidden, batch, cache, *, cache_scale_inv=1.0) -> f64 numpy

A batch is a list of MlaSequence (or (prefix, extend, slots) tuples): per sequence the tokens
already in the latent cache, the new ones, and the cache slots of all of them, prefix first.
"""

from __future__ import annotations

import itertools
import json
import os
import weakref
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import _C
from ._arrays import adapter_for
from ._backend import _device, make_attention_backend
from ._common import as_int, invalid_argument
from ._parallel import ContextParallelBatch, MlaCommunicator

MlaConfig = _C.MlaConfig
MlaWeights = _C.MlaWeights

# Live layers by number: the torch op of prefill_device_batch names its layer by this number (a
# schema takes no Python object); the entry goes with the layer.
_LAYERS: "weakref.WeakValueDictionary[int, MlaLayer]" = weakref.WeakValueDictionary()
_LAYER_NUMBERS = itertools.count(1)


@dataclass(frozen=True)
class MlaSequence:
    prefix: int  # tokens already in the cache
    extend: int  # new tokens, rows of `hidden`
    slots: Sequence[int]  # prefix + extend cache slots, prefix first


# The default calibration headroom: a sample's amax maps to 448 / 2.
MLA_CALIBRATION_HEADROOM = float(_C.MLA_CALIBRATION_HEADROOM)


@dataclass(frozen=True)
class MlaCalibration:
    """The static FP8 scales MlaLayer.calibrate found (docs/design.md section 5): `amax` the
    sample's largest magnitude of Q, K, V and the latent cache rows (a dict with those keys), and
    each scale_inv = 1 / max(amax * headroom / 448, 1 / (448 * 512)), 1 where amax is 0."""
    amax: dict
    headroom: float
    q_scale_inv: float
    k_scale_inv: float
    v_scale_inv: float
    cache_scale_inv: float

    def prefill_options(self) -> dict:
        """The scales as MlaLayer.prefill's keyword arguments."""
        return {"q_scale_inv": self.q_scale_inv, "k_scale_inv": self.k_scale_inv,
                "v_scale_inv": self.v_scale_inv, "cache_scale_inv": self.cache_scale_inv}


def mla_config(source) -> MlaConfig:
    """The MlaConfig of a preset name ("tiny", "deepseek-v3", ...: MlaConfig.preset_names()), a
    Hugging Face config.json's dict, the path of such a file, or a model directory holding one."""
    if isinstance(source, MlaConfig):
        return source
    if isinstance(source, dict):
        return MlaConfig.from_json(json.dumps(source), "config dict")
    path = os.fspath(source)
    if os.path.isdir(path):
        return MlaConfig.from_file(os.path.join(path, "config.json"))
    if os.path.exists(path) or path.endswith(".json"):
        return MlaConfig.from_file(path)
    return MlaConfig.preset(path)


def generate_mla_weights(config, format: str = "bf16", seed: int = 0) -> MlaWeights:
    """Random weights for `config` (mla_config's sources): "bf16", or "fp8" (e4m3 with one f32
    scale per 128 x 128 block)."""
    return _C.generate_mla_weights(mla_config(config), format, int(seed))


def load_mla_weights(model_dir, layer: int, tensor_parallel=None) -> MlaWeights:
    """Layer `layer`'s weights from a Hugging Face model directory (config.json and its
    safetensors, sharded or not); `weights.config` is the directory's config. The shards stay
    mapped while the weights, or a layer made from them, live. tensor_parallel=(rank, size):
    that rank's shard of the full checkpoint, as shard_mla_weights makes it."""
    rank, size = (0, 1) if tensor_parallel is None else tensor_parallel
    return _C.load_mla_weights(os.fspath(model_dir), int(layer), int(rank), int(size))


def shard_mla_weights(weights: MlaWeights, rank: int, size: int) -> MlaWeights:
    """Rank `rank` of `size`'s tensor-parallel shard of full weights (docs/parallelism.md): the
    q_b_proj / q_proj and kv_b_proj rows and the o_proj columns of its heads, the latent weights
    replicated; `weights.config` stays the full config and `weights.tensor_parallel` is
    (rank, size). A layer made from a shard runs config.heads / size heads and its prefill
    returns o_proj's partial sum: the sum over the ranks is the layer output."""
    return _C.shard_mla_weights(weights, int(rank), int(size))


def _batch(batch) -> list:
    """[(prefix, extend, slots)] as _C takes a batch: each sequence's slots one contiguous int64
    array (slots given as an array or a host tensor pass without a per-element conversion)."""
    rows = []
    for s in batch:
        prefix, extend, slots = (s.prefix, s.extend, s.slots) if isinstance(s, MlaSequence) else s
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if slots.ndim != 1:
            raise invalid_argument(f"MlaBatch: expected a sequence's slots 1-d (prefix + extend "
                                   f"cache slots), got shape {slots.shape}")
        rows.append((int(prefix), int(extend), slots))
    return rows


class MlaLayer:
    """MlaLayer(config, weights, device="cpu", backend=None): one MLA attention layer's prefill
    on "cpu" or "cuda[:N]". `backend` names the attention backend, which decides the path: "cpu"
    / "fp8-hopper" (the FP8 path, the default) or "cpu-bf16" / "bf16-hopper" (the BF16 path).
    `config` (mla_config's sources) must be the weights' own (None: weights.config). The
    one-time work (e4m3 dequantization on the CPU, the device copy and GEMM plans on CUDA) is
    done here. With a tensor-parallel shard (shard_mla_weights) the layer runs the rank's heads
    and prefill returns o_proj's partial sum, for the caller to sum over the ranks; with a
    `communicator` of the shard's rank and size (fp8mla.make_cpu_communicators, ...) prefill
    all-reduces it and returns the full output on every rank. The layer keeps the communicator
    alive."""

    def __init__(self, config, weights: MlaWeights, device="cpu", backend=None,
                 communicator=None):
        kind, index = _device(device)
        self.config = weights.config
        if config is not None and _fields(mla_config(config)) != _fields(self.config):
            raise invalid_argument(f"MlaLayer: config {mla_config(config)!r} is not the one the "
                                   f"weights were made for, {self.config!r}")
        self.device = device
        self.backend = make_attention_backend(
            backend or ("cpu" if kind == "cpu" else "fp8-hopper"))
        _check_type("MlaLayer", "communicator", communicator, MlaCommunicator, none=True)
        self.communicator = communicator  # the C++ layer points to it: it must outlive it
        self._layer = _C.MlaLayer(self.config, weights, kind, index,
                                  None if communicator is None else communicator._c)
        self.tensor_parallel = weights.tensor_parallel  # (rank, size); a shard: partial sums
        self._workspace = None  # CUDA: grown to the largest batch seen
        self.number = next(_LAYER_NUMBERS)  # torch.ops.fp8mla.mla_layer_prefill_device_batch's
        _LAYERS[self.number] = self
        self._hidden_size = int(self.config.hidden)  # a plain int: torch.compile traces it

    @property
    def projection_notes(self) -> list:
        """How each projection runs ("q_a_proj [1536, 7168]: fp8 block-scaled GEMM", ...)."""
        return list(self._layer.projection_notes)

    def output_quant_plan(self, **options) -> tuple:
        """How prefill with these options makes o_proj's input: ("fused" | "separate" | "none",
        the line saying why)."""
        return tuple(self._layer.output_quant_plan(_options(**options), self.backend.name))

    def workspace_bytes(self, max_tokens, max_sequences, max_prefix_tokens, max_gathered_rows=0,
                        **options) -> int:
        """Bytes of device workspace prefill needs for batches within these limits (0 on the
        CPU); max_gathered_rows: the rows of prefill_context_parallel's all-gather
        (ContextParallelBatch.workspace_limits gives all four); `options` as prefill's."""
        return self._layer.workspace_bytes(
            (int(max_tokens), int(max_sequences), int(max_prefix_tokens), int(max_gathered_rows)),
            _options(**options), self.backend.name)

    def prefill(self, hidden, batch, cache, *, out=None, one_shot_max_prefix=8192,
                chunk_capacity=8192, cache_scale_inv=1.0, q_scale_inv=1.0, k_scale_inv=1.0,
                v_scale_inv=1.0, fuse_output_quant=True, fold_chunks=True,
                fp8_kv_from_projection=False, workspace=None, stream=None):
        """hidden: bf16 [T, hidden], T the batch's extend tokens, rows in sequence order; cache:
        e4m3 [pages, page_size, 576], its prefix rows read and its extend rows written; returns
        out, bf16 [T, hidden]. numpy arrays (ml_dtypes) or torch tensors on the layer's device.
        Prefix keys up to one_shot_max_prefix are attended with the new ones in one pass, more
        in chunks of chunk_capacity merged by LSE; the scales are the FP8 path's static ones.
        fuse_output_quant: on the FP8 path the attention writes o_proj's FP8 input itself (the
        same bytes as a separate quantization; output_quant_plan says which runs). fold_chunks:
        each prefix chunk's attention call folds it into the output (else a merge after it, the
        same bytes). fp8_kv_from_projection: on the FP8 path with an FP8 kv_b_proj, kv_b's GEMMs
        write e4m3 K-nope and V themselves, rounded once from their f32 sums (docs/design.md,
        the layer's step 2; off by default). On
        CUDA the workspace is allocated (and kept) when not given, and `stream` defaults to
        torch's current stream. One call at a time per layer: a prefill or calibrate of the same
        layer from another thread meanwhile raises InvalidArgumentError (one layer per thread)."""
        arrays = adapter_for(hidden)
        rows = _batch(batch)
        options = _options(one_shot_max_prefix, chunk_capacity, cache_scale_inv, q_scale_inv,
                           k_scale_inv, v_scale_inv, fuse_output_quant, fold_chunks,
                           fp8_kv_from_projection)
        if out is None:
            out = arrays.empty((sum(r[1] for r in rows), self.config.hidden), "bf16", hidden)
        if _device(self.device)[0] == "cuda":
            limits = (sum(r[1] for r in rows), len(rows), sum(r[0] for r in rows), 0)
            workspace = self._cuda_workspace(workspace, limits, options, hidden)
            if stream is None:
                import torch

                stream = torch.cuda.current_stream(hidden.device).cuda_stream
        self._layer.prefill(arrays.tensor(hidden, "bf16"), rows, arrays.tensor(cache, "e4m3"),
                            self.backend.name, options, arrays.tensor(out, "bf16"),
                            None if workspace is None else _workspace_bytes(workspace),
                            int(stream or 0))
        return out

    def prefill_device_batch(self, hidden, cu_seqlens_q, positions, slot_mapping, cache, *,
                             max_seqlen_q, cu_seqlens_prefix=None, prefix_slots=None,
                             max_seqlen_prefix=0, out=None, one_shot_max_prefix=8192,
                             chunk_capacity=8192, cache_scale_inv=1.0, q_scale_inv=1.0,
                             k_scale_inv=1.0, v_scale_inv=1.0, fuse_output_quant=True,
                             fold_chunks=True, fp8_kv_from_projection=False, workspace=None,
                             stream=None):
        """prefill of a batch of new tokens described by arrays on the
        layer's device (fp8mla::MlaDeviceBatch), for a batch padded to a fixed shape that a CUDA
        graph captures once and replays for other batches of that shape. hidden: bf16 [T,
        hidden], T the padded row count; cu_seqlens_q: int32 [B + 1], each sequence's first row
        from 0, rows cu_seqlens_q[B] to T are padding; positions: int64 [T], each row's RoPE
        position (a sequence's own 0, 1, ...; padding: any valid one, e.g. 0); slot_mapping:
        int64 [T], each row's cache slot, -1 for a padding row (no cache write); max_seqlen_q
        bounds every sequence's tokens (the attention grid). Returns out, bf16 [T, hidden]: the
        real rows are what prefill of the same sequences gives, the padding rows are not to be
        used. Options as prefill's. On the CPU the metadata are read and checked as prefill's
        batch; on CUDA they are not read on the host (a slot outside the cache is skipped, not
        reported), the workspace is sized for (T, B, 0, 0) and allocated (and kept) when not
        given, and `stream` defaults to torch's current stream. For CUDA graphs give `out` and
        `workspace` (workspace_bytes(T, B, 0)): then this call allocates nothing and reads no
        device tensor on the host, so torch.cuda.graph can capture it; replay after copying
        another batch's metadata and hidden states into the same tensors (in place).

        Cached prefixes (optional): cu_seqlens_prefix int32 [B + 1] and prefix_slots int64
        [P] on the device, sequence b's prefix keys the cache rows prefix_slots[
        cu_seqlens_prefix[b]:cu_seqlens_prefix[b + 1]] (entries past cu_seqlens_prefix[B] are
        padding, -1 reads zeros), max_seqlen_prefix bounding every prefix; the new tokens then
        sit at positions prefix, prefix + 1, ... They are attended in one chunk merged by LSE
        (one_shot_max_prefix and chunk_capacity do not apply); the workspace is then
        workspace_bytes(T, B, P, one_shot_max_prefix=0, chunk_capacity=P)."""
        arrays = adapter_for(hidden)
        if out is None:
            out = arrays.empty((hidden.shape[0], self._hidden_size), "bf16", hidden)
        values = (hidden, cu_seqlens_q, positions, slot_mapping, cache, out, workspace,
                  as_int(max_seqlen_q), cu_seqlens_prefix, prefix_slots,
                  as_int(max_seqlen_prefix),
                  int(one_shot_max_prefix), int(chunk_capacity), float(cache_scale_inv),
                  float(q_scale_inv), float(k_scale_inv), float(v_scale_inv),
                  bool(fuse_output_quant), bool(fold_chunks), bool(fp8_kv_from_projection),
                  int(stream or 0))
        # torch: the op torch.ops.fp8mla.mla_layer_prefill_device_batch where torch.compile or
        # the dispatcher must see it, else self._prefill_device_batch directly.
        arrays.run_layer(self, "prefill_device_batch", values)
        return out

    def _prefill_device_batch(self, hidden, cu_seqlens_q, positions, slot_mapping, cache, out,
                              workspace, max_seqlen_q, cu_seqlens_prefix, prefix_slots,
                              max_seqlen_prefix, one_shot_max_prefix, chunk_capacity,
                              cache_scale_inv, q_scale_inv, k_scale_inv, v_scale_inv,
                              fuse_output_quant, fold_chunks, fp8_kv_from_projection, stream):
        """prefill_device_batch's work, out allocated: also the torch op's implementation."""
        arrays = adapter_for(hidden)
        options = _options(one_shot_max_prefix, chunk_capacity, cache_scale_inv, q_scale_inv,
                           k_scale_inv, v_scale_inv, fuse_output_quant, fold_chunks,
                           fp8_kv_from_projection)
        # Shapes only: len() of a device tensor reads no device memory (graph capture).
        tokens, sequences = hidden.shape[0], len(cu_seqlens_q) - 1
        prefix_tokens = 0 if cu_seqlens_prefix is None else len(prefix_slots)
        if _device(self.device)[0] == "cuda":
            # A device batch's prefixes are one chunk: sized as such by the limits' rule.
            sizing = _options(0, max(prefix_tokens, 1), cache_scale_inv, q_scale_inv,
                              k_scale_inv, v_scale_inv, fuse_output_quant, fold_chunks,
                              fp8_kv_from_projection)
            workspace = self._cuda_workspace(workspace, (tokens, sequences, prefix_tokens, 0),
                                             sizing, hidden)
            if not stream:
                import torch

                stream = torch.cuda.current_stream(hidden.device).cuda_stream
        self._layer.prefill_device_batch(
            arrays.tensor(hidden, "bf16"), arrays.tensor(cu_seqlens_q), arrays.tensor(positions),
            arrays.tensor(slot_mapping), int(max_seqlen_q),
            None if cu_seqlens_prefix is None else arrays.tensor(cu_seqlens_prefix),
            None if cu_seqlens_prefix is None else arrays.tensor(prefix_slots),
            int(max_seqlen_prefix), arrays.tensor(cache, "e4m3"),
            self.backend.name, options, arrays.tensor(out, "bf16"),
            None if workspace is None else _workspace_bytes(workspace), int(stream or 0))

    def calibrate(self, hidden, batch, *, headroom: float = MLA_CALIBRATION_HEADROOM,
                  stream=None) -> MlaCalibration:
        """The static FP8 scales for a sample batch (hidden and batch as prefill's; at least
        one new token): the amax of Q after RoPE, K, V and the latent cache rows over its new
        tokens, computed with the layer's own steps as the BF16 path runs them (the prefixes set
        the positions; no cache is read or written), mapped to 448 / headroom. Not for the hot
        path: on CUDA it allocates its workspace and waits for `stream` (default: torch's
        current stream). Use the result with prefill(..., **calibration.prefill_options())."""
        arrays = adapter_for(hidden)
        if _device(self.device)[0] == "cuda" and stream is None:
            import torch

            stream = torch.cuda.current_stream(hidden.device).cuda_stream
        q, k, v, cache, room, q_si, k_si, v_si, cache_si = self._layer.calibrate(
            arrays.tensor(hidden, "bf16"), _batch(batch), float(headroom), int(stream or 0))
        return MlaCalibration({"q": q, "k": k, "v": v, "cache": cache}, room, q_si, k_si, v_si,
                              cache_si)

    def prefill_context_parallel(self, hidden, cp_batch, communicator, cache, *, out=None,
                                 one_shot_max_prefix=8192, chunk_capacity=8192,
                                 cache_scale_inv=1.0, q_scale_inv=1.0, k_scale_inv=1.0,
                                 v_scale_inv=1.0, fuse_output_quant=True, fold_chunks=True,
                                 fp8_kv_from_projection=False, workspace=None, stream=None):
        """prefill for rank cp_batch.rank of a context-parallel group (docs/parallelism.md):
        cp_batch is fp8mla.context_parallel_batch(full_batch, rank, size), hidden the rank's
        rows (bf16 [len(cp_batch.tokens), hidden], the full batch's hidden[cp_batch.tokens]),
        cache the rank's own copy holding every sequence's prefix rows. Every rank of the group
        calls this at once, each from its own thread or process, with `communicator` of its
        rank and size: the ranks' latent rows are all-gathered and written to every rank's
        cache, which then holds the whole batch's rows; returns out, bf16 [len(cp_batch.tokens),
        hidden], the rank's rows of the output (all-reduced too when the layer has a
        tensor-parallel communicator). Options, workspace and stream as prefill's; the CUDA
        workspace is sized from cp_batch.workspace_limits."""
        op = "MlaLayer.prefill_context_parallel"
        _check_type(op, "cp_batch", cp_batch, ContextParallelBatch)
        _check_type(op, "communicator", communicator, MlaCommunicator)
        arrays = adapter_for(hidden)
        options = _options(one_shot_max_prefix, chunk_capacity, cache_scale_inv, q_scale_inv,
                           k_scale_inv, v_scale_inv, fuse_output_quant, fold_chunks,
                           fp8_kv_from_projection)
        if out is None:
            out = arrays.empty((len(cp_batch.tokens), self.config.hidden), "bf16", hidden)
        if _device(self.device)[0] == "cuda":
            workspace = self._cuda_workspace(workspace, cp_batch.workspace_limits, options, hidden)
            if stream is None:
                import torch

                stream = torch.cuda.current_stream(hidden.device).cuda_stream
        self._layer.prefill_context_parallel(
            arrays.tensor(hidden, "bf16"), cp_batch._c, communicator._c,
            arrays.tensor(cache, "e4m3"), self.backend.name, options, arrays.tensor(out, "bf16"),
            None if workspace is None else _workspace_bytes(workspace), int(stream or 0))
        return out

    def _cuda_workspace(self, workspace, limits, options, hidden):
        if workspace is not None:
            return workspace
        needed = self._layer.workspace_bytes(tuple(limits), options, self.backend.name)
        if self._workspace is None or self._workspace.numel() < needed:
            import torch

            self._workspace = torch.empty(needed, dtype=torch.uint8, device=hidden.device)
        return self._workspace

    def __repr__(self) -> str:
        return (f"fp8mla.MlaLayer({self.config.name!r}, device={str(self.device)!r}, "
                f"backend={self.backend.name!r})")


def _workspace_bytes(workspace):
    """The workspace as _C takes it: any dtype; uint8 (how engines and _cuda_workspace hold raw
    bytes) is named as e4m3, the 1-byte type _C reads uint8 arrays as."""
    return (workspace, "e4m3") if str(workspace.dtype) in ("uint8", "torch.uint8") else workspace


def _check_type(op: str, name: str, value, cls, none: bool = False) -> None:
    if not isinstance(value, cls) and not (none and value is None):
        expected = f"an fp8mla.{cls.__name__}" + (" or None" if none else "")
        raise invalid_argument(f"{op}: expected {name} {expected}, got {type(value).__name__}")


def _fields(c: MlaConfig) -> tuple:
    return (c.hidden, c.heads, c.q_lora_rank, c.kv_lora_rank, c.max_position, c.rms_norm_eps,
            c.rope_theta, c.yarn)


def _options(one_shot_max_prefix=8192, chunk_capacity=8192, cache_scale_inv=1.0, q_scale_inv=1.0,
             k_scale_inv=1.0, v_scale_inv=1.0, fuse_output_quant=True, fold_chunks=True,
             fp8_kv_from_projection=False) -> tuple:
    return (int(one_shot_max_prefix), int(chunk_capacity), float(cache_scale_inv),
            float(q_scale_inv), float(k_scale_inv), float(v_scale_inv), bool(fuse_output_quant),
            bool(fold_chunks), bool(fp8_kv_from_projection))


def mla_prefill_reference(weights: MlaWeights, hidden, batch, cache, *,
                          cache_scale_inv: float = 1.0) -> np.ndarray:
    """The float64 reference of MlaLayer.prefill on CPU inputs (the cache before the prefill):
    dequantized weights, no intermediate rounding, exact softmax. Returns f64 [T, hidden]."""
    arrays = adapter_for(hidden)
    return _C.mla_prefill_reference(weights, arrays.tensor(hidden, "bf16"), _batch(batch),
                                    arrays.tensor(cache, "e4m3"), float(cache_scale_inv))
