"""fp8mla — FP8 MLA prefill for NVIDIA Hopper, with a CPU implementation of every op.

Quantization ops (docs/design.md sections 2 and 3). Tensors: torch tensors (CPU or CUDA, read
directly; each op is also a torch.library custom op, see fp8mla.torch_ops), numpy arrays (CPU; bf16
and fp8 through ml_dtypes) or any other DLPack array when every output is given. Outputs are
allocated on the input's device when not given. Bad arguments raise fp8mla.Error (its subclass
InvalidArgumentError is also a ValueError) with the C++ library's message.
    quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3") -> out
    quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3") -> (out, scale)
    quantize_fp8_per_token_group(x, *, out=None, scales=None, group_size=128, eps=1e-10,
                                 round_scale_to_pow2=False, scale_layout="row_major")
        -> (out, scales)
    quantize_nvfp4(x, global_scale, *, out=None, block_scales=None, layout="swizzled")
        -> (out, block_scales)
    info() -> dict

MLA prefill preparation (docs/design.md section 3, ops 4-7; the C++ header fp8mla/mla_prep.hpp
defines the arithmetic). The latent cache is e4m3 [num_pages, page_size, 576] =
[kv_c 512 | k_pe 64]:

    make_cos_sin_cache(max_pos, *, out=None, rope_dim=64, theta=10000.0, yarn=None, device=None)
        -> f32 [max_pos, rope_dim]
    softmax_mscale(*, yarn=None) -> float
    mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, *, style="interleaved",
                          q_scale_inv=1.0, k_scale_inv=1.0, q_out=None, k_out=None, cache=None,
                          slot_mapping=None, cache_scale_inv=1.0, error_flag=None, kv_c=None)
        -> (q_out, k_out)
    mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, *, scale_inv=1.0, error_flag=None) -> None
    mla_kv_gather(cache, slots, scale, *, kv_c_out=None, k_pe_out=None, error_flag=None)
        -> (kv_c_out, k_pe_out)
    mla_kv_pack_quantize_fp8(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0, k_out=None,
                             v_out=None, v_layout="token_major") -> (k_out, v_out)
    mla_v_quantize_fp8(v, *, v_out=None, v_scale_inv=1.0, v_layout="token_major") -> v_out

Attention (docs/design.md section 3, ops 8-9; fp8mla/attention.hpp):

    prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                      softmax_scale, causal=True, q_descale=None, k_descale=None,
                      v_descale=None, out=None, lse=None, output_scale=None,
                      output_block_scale=None, k_rope=None, return_lse=False)
        -> out, or (out, lse)
    merge_attention_states(o_a, lse_a, o_b, lse_b, *, out=None, out_lse=None, output_scale=None,
                           output_block_scale=None, num_tokens=None) -> (out, out_lse)

Output quantization (docs/design.md section 6; fp8mla/output_quant.hpp):

    detect_output_quant_key(output, output_scale=None, output_block_scale=None, output_dim=None)
        -> None, "fp8_static", "fp8_group128", "fp8_group64" or "nvfp4"
    enable_output_quant_fusion() -> fp8mla.torch_fusion.OutputQuantFusionPass
        (torch only: the torch.compile pass fusing attention + quantization into the attention op)

Attention backends (docs/design.md section 4; fp8mla/attention_backend.hpp), for engines:

    make_attention_backend(name) -> AttentionBackend   ("cpu", "cpu-bf16", "fp8-hopper",
        "bf16-hopper"; attention_backend_names() lists them)
    backend.capabilities -> BackendCapabilities (dataclass)
    backend.check_backend(*, attention_dtype="e4m3", head_dim_qk=192, head_dim_v=128,
                          page_size=64, output_quant=None, prepare_prefill_qkv=False,
                          pack_prefix_chunk_kv=False, device="cpu") -> None
    backend.prepare_prefill_qkv(q, q_pe, k_nope, k_pe, positions, cos_sin, v, *,
                                style="interleaved", q_scale_inv=1.0, k_scale_inv=1.0,
                                q_out=None, k_out=None, cache=None, slot_mapping=None,
                                cache_scale_inv=1.0, error_flag=None, kv_a=None,
                                v_scale_inv=1.0, v_out=None) -> (q_out, k_out, v_out)
    backend.pack_prefix_chunk_kv(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0,
                                 k_out=None, v_out=None) -> (k_out, v_out)

The MLA layer (docs/design.md section 5; fp8mla/mla_layer.hpp), see fp8mla._layer:

    mla_config(preset name | config.json dict | path | model dir) -> MlaConfig
    generate_mla_weights(config, format="bf16" | "fp8", seed=0) -> MlaWeights
    load_mla_weights(model_dir, layer, tensor_parallel=None) -> MlaWeights
        (weights.config: the directory's; tensor_parallel=(rank, size): that rank's shard)
    shard_mla_weights(weights, rank, size) -> MlaWeights   (docs/parallelism.md)
    MlaLayer(config, weights, device="cpu", backend=None, communicator=None)
        (a shard with a communicator of its rank and size: prefill all-reduces o_proj)
    layer.prefill(hidden, batch, cache, *, out=None, one_shot_max_prefix=8192,
                  chunk_capacity=8192, cache_scale_inv=1.0, ...) -> out bf16 [T, hidden]
        batch: [MlaSequence(prefix, extend, slots) or (prefix, extend, slots), ...]
    layer.prefill_context_parallel(hidden, cp_batch, communicator, cache, *, out=None, ...)
        -> out bf16 [rank's tokens, hidden]
    layer.prefill_device_batch(hidden, cu_seqlens_q, positions, slot_mapping, cache, *,
                               max_seqlen_q, out=None, ...) -> out bf16 [padded T, hidden]
        (new tokens only, metadata on the device; CUDA-graph capturable with out, workspace;
        the torch op torch.ops.fp8mla.mla_layer_prefill_device_batch under torch.compile)

Tensor and context parallelism (docs/parallelism.md; fp8mla/mla_parallel.hpp), see
fp8mla._parallel:

    make_cpu_communicators(size) -> [MlaCommunicator]   (in-process group, one thread a rank)
    make_nccl_communicators(devices) -> [MlaCommunicator]
    nccl_communicator(comm_ptr) -> MlaCommunicator   (an engine's ncclComm_t, borrowed)
    comm.all_reduce_sum(inout) / comm.reduce_scatter_sum(in_, out) / comm.all_gather(in_, out)
    context_parallel_batch(batch, rank, size) -> ContextParallelBatch
        (batch, tokens, rows_per_rank, gathered_slots, workspace_limits)
    layer.calibrate(hidden, batch, *, headroom=2.0) -> MlaCalibration
        (static FP8 scales: layer.prefill(..., **calibration.prefill_options()))
    mla_prefill_reference(weights, hidden, batch, cache, *, cache_scale_inv=1.0) -> f64 numpy

The keyword-only arguments follow the order of the C++ API. Every op but
detect_output_quant_key (metadata only) also takes `stream=` (an int cudaStream_t handle); by
default CUDA torch tensors use torch.cuda.current_stream(). The ops are generated from the table
in fp8mla/_ops.py, which says how to add one.
"""

from __future__ import annotations

import sys

from . import _C
from ._arrays import adapter_for as _adapter_for
from ._arrays import load_torch as _load_torch
from ._backend import (
    AttentionBackend,
    BackendCapabilities,
    attention_backend_names,
    check_backend,
    make_attention_backend,
)
from ._C import Error, InvalidArgumentError, UnsupportedError
from ._common import yarn_list as _yarn_list
from ._layer import (
    MLA_CALIBRATION_HEADROOM,
    MlaCalibration,
    MlaConfig,
    MlaLayer,
    MlaSequence,
    MlaWeights,
    generate_mla_weights,
    load_mla_weights,
    mla_config,
    mla_prefill_reference,
    shard_mla_weights,
)
from ._common import yarn_tuple as _yarn_tuple
from ._parallel import (
    ContextParallelBatch,
    MlaCommunicator,
    context_parallel_batch,
    make_cpu_communicators,
    make_nccl_communicators,
    nccl_communicator,
)
from ._ops import OPS as _OPS

__version__ = _C.__version__


for _op in _OPS:
    globals()[_op.name] = _op.public_function(_adapter_for)
del _op


def softmax_mscale(*, yarn=None) -> float:
    """YaRN's mscale, whose square multiplies the softmax scale: scale = qk_dim**-0.5 *
    mscale**2 with mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (1.0 without YaRN, with
    factor <= 1 or without mscale_all_dim). `yarn` as for make_cos_sin_cache."""
    return _C.softmax_mscale(_yarn_tuple(_yarn_list("softmax_mscale", yarn)))


def __getattr__(name):
    """fp8mla.torch_fusion (it imports torch) on first use, as `import fp8mla.torch_fusion`."""
    if name == "torch_fusion":
        import importlib

        return importlib.import_module(".torch_fusion", __name__)
    raise AttributeError(f"module 'fp8mla' has no attribute {name!r}")


def enable_output_quant_fusion():
    """Turns on the torch.compile pass that fuses the standalone quantization of an attention
    op's bf16 output into the attention op (fp8mla.torch_fusion; needs torch) for every later
    torch.compile with the inductor backend, and returns the pass: its `fused` and `skipped`
    lists say what it did."""
    from .torch_fusion import enable_output_quant_fusion as enable

    return enable()


def info() -> dict:
    """Build and device information: version, cuda (bool), cuda_arch, devices, ..."""
    return _C.info()


__all__ = ["AttentionBackend", "BackendCapabilities", "ContextParallelBatch", "Error",
           "InvalidArgumentError", "MLA_CALIBRATION_HEADROOM", "MlaCalibration",
           "MlaCommunicator", "MlaConfig", "MlaLayer", "MlaSequence", "MlaWeights",
           "UnsupportedError", "attention_backend_names", "check_backend",
           "context_parallel_batch", "enable_output_quant_fusion", "generate_mla_weights", "info",
           "load_mla_weights", "make_attention_backend", "make_cpu_communicators",
           "make_nccl_communicators", "mla_config", "mla_prefill_reference", "nccl_communicator",
           "shard_mla_weights", "softmax_mscale",
           *(op.name for op in _OPS)]

# Engines import torch first: register the custom ops now, so that torch.compile traces straight
# into them. Otherwise they are registered when the first torch tensor arrives.
if "torch" in sys.modules:
    _load_torch()
