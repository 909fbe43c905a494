#include "model/mla_workspace.hpp"

#include <algorithm>

#include "cuda/model/cublas_linear.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/mla_weights.hpp"

namespace fp8mla {
namespace {

using cuda::model::LinearFormat;

std::int64_t round_up(std::int64_t x, std::int64_t m) {
  return (x + m - 1) / m * m;
}

// Hands out 256-byte aligned pieces of the workspace; with a null base it only counts bytes.
class Carver {
 public:
  explicit Carver(std::byte* base) : base_(base) {}
  template <typename T>
  T* take(std::int64_t count) {
    offset_ = round_up(std::int64_t(offset_), kMlaWorkspaceAlign);
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += std::size_t(std::max<std::int64_t>(count, 0)) * sizeof(T);
    return p;
  }
  std::size_t bytes() const { return offset_; }

 private:
  std::byte* base_;
  std::size_t offset_ = 0;
};

MlaBuffers carve(Carver& w, const MlaConfig& c, const WorkSizes& s) {
  const std::int64_t T = s.tokens, B = s.sequences, H = c.heads, P = s.prefix_keys();
  const std::int64_t one_shot = s.one_shot_prefix > 0 ? s.one_shot_prefix + T : 0;
  const int eb = s.fp8 ? 1 : 2;
  MlaBuffers b{};
  b.positions = w.take<std::int64_t>(T);
  b.meta_begin = reinterpret_cast<std::byte*>(b.positions);
  b.slots = w.take<std::int64_t>(T);
  b.prefix_rows = w.take<std::int64_t>(s.prefix_rows);
  b.cu_q = w.take<std::int32_t>(B + 1);
  b.cu_k_one_shot = w.take<std::int32_t>(B + 1);
  b.chunk_cu_k = w.take<std::int32_t>(s.chunks * (B + 1));
  b.descales = w.take<float>(3);
  b.pack_rows = w.take<std::int64_t>(s.gathered_rows);
  b.unpack_rows = w.take<std::int64_t>(s.gathered_rows);
  b.meta_end = reinterpret_cast<std::byte*>(w.take<std::byte>(0));
  const std::int64_t gemm_rows = std::max(T, P);
  const std::int64_t widest_in = std::max({c.hidden, c.q_lora_rank, c.kv_lora_rank, c.o_width()});
  b.gemm_x = w.take<std::uint8_t>(gemm_rows * widest_in);
  // Scales at a pitch of the rows rounded up to 4 (what the e4m3-output GEMM's TMA reads).
  b.gemm_x_scales = w.take<float>((gemm_rows + 3) / 4 * 4 * (widest_in / kWeightBlock));
  b.q_a = w.take<std::uint16_t>(T * c.q_lora_rank);
  b.q_a_norm = w.take<std::uint16_t>(T * c.q_lora_rank);
  b.kv_a = w.take<std::uint16_t>(T * kMlaLatentDim);
  b.kv_c = w.take<std::uint16_t>(T * c.kv_lora_rank);
  b.q = w.take<std::uint16_t>(T * c.q_width());
  b.kv = w.take<std::uint16_t>(s.kv_from_projection ? 0 : T * c.kv_b_width());
  // The FP8 path's K is split: k_nope's [n, H, 128] then the RoPE part's [n, 64].
  const auto split_k = [&](std::int64_t n) { return n * (H * kMlaNopeDim + kMlaRopeDim); };
  if (s.fp8) {
    b.q8 = w.take<std::uint8_t>(T * H * kMlaQkDim);
    b.k8 = w.take<std::uint8_t>(split_k(T));
    b.v8 = w.take<std::uint8_t>(H * kMlaVDim * transposed_v_pitch(T));
  } else {
    b.k16 = w.take<std::uint16_t>(T * H * kMlaQkDim);
    b.k_pe16 = w.take<std::uint16_t>(T * kMlaRopeDim);
  }
  b.prefix_c = w.take<std::uint16_t>(P * c.kv_lora_rank);
  b.prefix_pe = w.take<std::uint16_t>(P * kMlaRopeDim);
  b.prefix_kv = w.take<std::uint16_t>(P * c.kv_b_width());
  if (s.fp8) {
    b.prefix_k8 = w.take<std::uint8_t>(split_k(P));
    b.prefix_v8 = w.take<std::uint8_t>(P > 0 ? H * kMlaVDim * transposed_v_pitch(P) : 0);
    b.one_shot_k = w.take<std::uint8_t>(split_k(one_shot));
    b.one_shot_v =
        w.take<std::uint8_t>(one_shot > 0 ? H * kMlaVDim * transposed_v_pitch(one_shot) : 0);
  } else {
    b.prefix_k16 = w.take<std::uint16_t>(P * H * kMlaQkDim);
    b.one_shot_k = w.take<std::uint8_t>(one_shot * H * kMlaQkDim * eb);
    b.one_shot_v = w.take<std::uint8_t>(one_shot * H * kMlaVDim * eb);
  }
  // A fused path writes the o_proj input into gemm_x: the bf16 output is only the chunks' merge
  // target.
  b.attn = w.take<std::uint16_t>(s.fused_output_quant && s.chunks == 0 ? 0 : T * H * kMlaVDim);
  b.lse = w.take<float>(T * H);
  const bool chunk_outputs = s.chunks > 0 && !s.fold_chunks;
  b.chunk_out = w.take<std::uint16_t>(chunk_outputs ? T * H * kMlaVDim : 0);
  b.chunk_lse = w.take<float>(chunk_outputs ? T * H : 0);
  b.gathered = w.take<std::uint8_t>(s.gathered_rows * kMlaLatentDim);
  // cuBLASLt's workspace, and room for the widest fp8 GEMM's scratch at these row counts.
  std::size_t scratch = 0;
  const auto need = [&](std::int64_t out, std::int64_t in, std::int64_t rows) {
    const cuda::model::LinearWeight fp8{LinearFormat::kFp8Block, nullptr, nullptr, out, in};
    scratch = std::max(scratch, cuda::model::linear_scratch_bytes(fp8, rows));
  };
  need(c.q_lora_rank, c.hidden, T);
  need(c.q_width(), c.q_lora_rank > 0 ? c.q_lora_rank : c.hidden, T);
  need(kMlaLatentDim, c.hidden, T);
  need(c.kv_b_width(), c.kv_lora_rank, T);
  need(c.kv_b_width(), c.kv_lora_rank, P);
  need(c.hidden, c.o_width(), T);
  b.cublas_bytes = cuda::model::kLinearWorkspaceBytes + scratch;
  b.cublas = w.take<std::byte>(std::int64_t(b.cublas_bytes));
  return b;
}

}  // namespace

WorkSizes work_sizes(const MlaWorkspaceLimits& limits, const MlaPrefillOptions& options,
                     MlaPath path) {
  WorkSizes s;
  s.tokens = limits.max_tokens;
  s.sequences = limits.max_sequences;
  s.prefix_rows = limits.max_prefix_tokens;
  s.one_shot_prefix = std::min(limits.max_prefix_tokens, options.one_shot_max_prefix);
  if (limits.max_prefix_tokens > options.one_shot_max_prefix) {
    s.chunk_keys = std::min(limits.max_prefix_tokens, options.chunk_capacity);
    s.chunks = (limits.max_prefix_tokens + options.chunk_capacity - 1) / options.chunk_capacity;
  }
  s.fp8 = path.fp8;
  s.fused_output_quant = path.output_quant == MlaOutputQuant::kFused;
  s.fold_chunks = path.fold_chunks;
  s.kv_from_projection = path.kv_from_projection;
  s.gathered_rows = limits.max_gathered_rows;
  return s;
}

WorkSizes work_sizes(const MlaBatchPlan& plan, MlaPath path) {
  WorkSizes s;
  s.tokens = plan.tokens;
  s.sequences = plan.sequences;
  s.prefix_rows = std::int64_t(plan.prefix_rows.size());
  s.one_shot_prefix = plan.prefix_attention == PrefixAttention::kChunked ? 0 : s.prefix_rows;
  for (const PrefixChunk& chunk : plan.chunks) s.chunk_keys = std::max(s.chunk_keys, chunk.keys());
  s.chunks = std::int64_t(plan.chunks.size());
  s.fp8 = path.fp8;
  s.fused_output_quant = path.output_quant == MlaOutputQuant::kFused;
  s.fold_chunks = path.fold_chunks;
  s.kv_from_projection = path.kv_from_projection;
  s.gathered_rows = plan.gathered_rows();
  return s;
}

std::size_t mla_workspace_bytes(const MlaConfig& config, const WorkSizes& sizes) {
  Carver counter(nullptr);
  carve(counter, config, sizes);
  return counter.bytes();
}

MlaBuffers carve_mla_workspace(std::byte* base, const MlaConfig& config, const WorkSizes& sizes) {
  Carver carver(base);
  return carve(carver, config, sizes);
}

}  // namespace fp8mla
