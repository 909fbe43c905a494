// The CUDA MLA layer's workspace: which buffers a prefill needs for a batch's sizes and where each
// lies in the caller's memory. One walk both sizes (workspace_bytes) and carves (prefill) it, so
// the two cannot disagree; every buffer grows with each size, so a workspace sized for limits
// that bound a batch holds it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fp8mla/mla_layer.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {

inline constexpr std::size_t kMlaWorkspaceAlign = 256;  // of the workspace and of every buffer

// The batch sizes the workspace is carved for.
struct WorkSizes {
  std::int64_t tokens = 0, sequences = 0;
  std::int64_t prefix_rows = 0;      // all prefix tokens of the batch
  std::int64_t one_shot_prefix = 0;  // prefix keys attended one-shot
  std::int64_t chunk_keys = 0;       // keys of the largest prefix chunk
  std::int64_t chunks = 0;
  bool fp8 = false;
  // The attention writes o_proj's FP8 input (fused output quantization): without chunks, no
  // bf16 attention output is kept.
  bool fused_output_quant = false;
  bool fold_chunks = false;        // the chunks fold into the output: no chunk output of their own
  // kv_b's GEMMs write e4m3 K-nope and V for the extend tokens: no bf16 kv_b output of theirs.
  bool kv_from_projection = false;
  std::int64_t gathered_rows = 0;  // context parallelism: the all-gather's latent rows
  std::int64_t prefix_keys() const { return std::max(one_shot_prefix, chunk_keys); }
};

// The largest sizes a batch within `limits` can have, and a planned batch's own.
WorkSizes work_sizes(const MlaWorkspaceLimits& limits, const MlaPrefillOptions& options,
                     MlaPath path);
WorkSizes work_sizes(const MlaBatchPlan& plan, MlaPath path);

// The workspace's pieces. Names say what each holds; u8 ones hold e4m3.
struct MlaBuffers {
  // Batch metadata, one host-to-device copy: [meta_begin, meta_end).
  std::byte *meta_begin, *meta_end;
  std::int64_t *positions, *slots, *prefix_rows;
  std::int32_t *cu_q, *cu_k_one_shot, *chunk_cu_k;
  float* descales;                        // q, k, v
  std::int64_t *pack_rows, *unpack_rows;  // context parallelism: the plan's, each of gathered rows
  // GEMM inputs quantized per 128-group, and their column-major scales.
  std::uint8_t* gemm_x;
  float* gemm_x_scales;
  std::uint16_t *q_a, *q_a_norm, *kv_a, *kv_c, *q, *kv;  // projections of the extend tokens
  std::uint8_t *q8, *k8, *v8;   // FP8 path: Q, K split (k_nope rows, then k_rope rows), V^T
  std::uint16_t *k16, *k_pe16;  // BF16 path: K, the RoPE'd k_pe
  std::uint16_t *prefix_c, *prefix_pe, *prefix_kv;  // prefix keys: latent rows, kv_b
  std::uint8_t *prefix_k8, *prefix_v8;
  std::uint16_t* prefix_k16;
  std::uint8_t *one_shot_k, *one_shot_v;  // each sequence's prefix then extend keys
  std::uint16_t* attn;                    // [T, H, 128] bf16 (not on a fused path without chunks)
  float* lse;
  std::uint16_t* chunk_out;
  float* chunk_lse;
  std::uint8_t* gathered;  // context parallelism: [gathered rows, 576] e4m3
  std::byte* cublas;
  std::size_t cublas_bytes;
};

std::size_t mla_workspace_bytes(const MlaConfig& config, const WorkSizes& sizes);
// The buffers in the workspace at `base` (kMlaWorkspaceAlign aligned, mla_workspace_bytes long).
MlaBuffers carve_mla_workspace(std::byte* base, const MlaConfig& config, const WorkSizes& sizes);

}  // namespace fp8mla
