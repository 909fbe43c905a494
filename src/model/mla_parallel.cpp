// Tensor-parallel shards of an MLA layer's weights (fp8mla/mla_parallel.hpp): the rows of the
// head-producing projections and the columns of o_proj of one rank's heads.
#include "fp8mla/mla_parallel.hpp"

#include <cstring>
#include <string>

#include "fp8mla/error.hpp"
#include "model/mla_weight_specs.hpp"

namespace fp8mla {
namespace {

// Per head: q_b_proj / q_proj rows, kv_b_proj rows, o_proj columns.
constexpr std::int64_t kQRowsPerHead = kMlaQkDim;
constexpr std::int64_t kKvBRowsPerHead = kMlaNopeDim + kMlaVDim;
constexpr std::int64_t kOColsPerHead = kMlaVDim;

[[noreturn]] void fail(const MlaConfig& c, MlaTensorParallel tp, const std::string& what) {
  throw Error(ErrorCategory::kInvalidArgument,
              concat("MLA tensor parallel: config '", c.name, "' (", c.heads, " heads), rank ",
                     tp.rank, " of ", tp.size, ": ", what));
}

// Rows [first, first + rows) of a [out, in] projection and, for e4m3, the block-scale rows
// covering them (first and rows on 128-row blocks, checked by check_mla_tensor_parallel).
MlaProjection row_slice(const MlaProjection& p, std::int64_t first, std::int64_t rows) {
  MlaProjection s;
  s.weight = p.weight.narrow(0, first, rows);
  if (p.scale_inv.data() != nullptr) {
    s.scale_inv = p.scale_inv.narrow(0, first / kWeightBlock, model::weight_blocks(rows));
  }
  return s;
}

// Columns [first, first + cols) of a row-major [rows, in] tensor of `elem` bytes into `to`.
void copy_columns(const TensorView& from, std::int64_t first, std::int64_t cols, std::size_t elem,
                  std::byte* to) {
  const std::int64_t rows = from.size(0), in = from.size(1);
  const auto* src = static_cast<const std::byte*>(from.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(to + std::size_t(r * cols) * elem, src + std::size_t(r * in + first) * elem,
                std::size_t(cols) * elem);
  }
}

// The full weights' own storage (generated weights) and the shard's copies, kept together so the
// shard's views into either stay valid.
struct ShardStorage {
  std::shared_ptr<std::vector<std::byte>> full;
  std::vector<std::byte> copies;
};

// The check that every projection of `w` has the full config's shape, before any view is taken.
void check_full_shapes(const MlaWeights& w, const MlaConfig& c, MlaTensorParallel tp) {
  const DType dtype = w.format == WeightFormat::kFp8Block ? DType::kE4M3 : DType::kBF16;
  for (const model::ProjectionSpec& p : model::projections(c)) {
    const TensorView& t = (w.*(p.member)).weight;
    if (t.data() == nullptr || t.dtype() != dtype || t.ndim() != 2 || t.size(0) != p.out ||
        t.size(1) != p.in || !t.is_contiguous() || t.device().is_cuda()) {
      fail(c, tp,
           concat("shard_mla_weights: expected the full weight '", p.name, ".weight' as a ",
                  "contiguous host ", dtype_name(dtype), " [", p.out, ", ", p.in, "], got ",
                  t.data() == nullptr ? "no data: " : "", t.describe()));
    }
    const TensorView& s = (w.*(p.member)).scale_inv;
    if (w.format == WeightFormat::kFp8Block &&
        (s.data() == nullptr || s.ndim() != 2 || s.size(0) != model::weight_blocks(p.out) ||
         s.size(1) != model::weight_blocks(p.in) || !s.is_contiguous() ||
         s.dtype() != DType::kF32)) {
      fail(c, tp,
           concat("shard_mla_weights: expected '", p.name, ".weight_scale_inv' contiguous f32 [",
                  model::weight_blocks(p.out), ", ", model::weight_blocks(p.in), "], got ",
                  s.data() == nullptr ? "no data: " : "", s.describe()));
    }
  }
}

}  // namespace

void check_mla_tensor_parallel(const MlaConfig& c, MlaTensorParallel tp, WeightFormat format) {
  if (tp.size != 1 && tp.size != 2 && tp.size != 4 && tp.size != 8)
    fail(c, tp, "expected size 1, 2, 4 or 8");
  if (c.heads % tp.size != 0)
    fail(c, tp, concat("expected a size dividing the head count ", c.heads));
  if (tp.rank < 0 || tp.rank >= tp.size) fail(c, tp, concat("expected 0 <= rank < ", tp.size));
  const std::int64_t q_rows = c.heads / tp.size * kQRowsPerHead;
  if (format == WeightFormat::kFp8Block && tp.size > 1 && q_rows % kWeightBlock != 0) {
    fail(c, tp,
         concat(c.q_lora_rank > 0 ? "q_b_proj" : "q_proj", " shards of ", c.heads / tp.size,
                " heads * ", kQRowsPerHead, " = ", q_rows,
                " rows do not fall on its weight_scale_inv's ", kWeightBlock,
                "-row blocks (FP8 block-scaled weights need an even number of heads per rank)"));
  }
}

MlaConfig mla_rank_config(const MlaConfig& config, MlaTensorParallel tp, WeightFormat format) {
  check_mla_tensor_parallel(config, tp, format);
  MlaConfig local = config;
  local.heads = config.heads / tp.size;
  return local;
}

MlaWeights shard_mla_weights(const MlaWeights& full, const MlaConfig& config,
                             MlaTensorParallel tp) {
  check_mla_tensor_parallel(config, tp, full.format);
  check_full_shapes(full, config, tp);
  const std::int64_t heads = config.heads / tp.size, first = tp.rank * heads;
  MlaWeights shard = full;
  if (tp.size == 1) return shard;
  MlaProjection& q = config.q_lora_rank > 0 ? shard.q_b_proj : shard.q_proj;
  q = row_slice(q, first * kQRowsPerHead, heads * kQRowsPerHead);
  shard.kv_b_proj = row_slice(full.kv_b_proj, first * kKvBRowsPerHead, heads * kKvBRowsPerHead);

  // o_proj [hidden, H * 128] -> [hidden, heads * 128]; its scales [ceil(hidden / 128), H].
  const MlaProjection& o = full.o_proj;
  const bool fp8 = full.format == WeightFormat::kFp8Block;
  const std::int64_t rows = config.hidden, cols = heads * kOColsPerHead;
  const std::size_t elem = fp8 ? 1 : 2;
  const std::size_t weight_bytes = std::size_t(rows * cols) * elem;
  const std::int64_t scale_rows = model::weight_blocks(rows), scale_cols = cols / kWeightBlock;
  auto storage = std::make_shared<ShardStorage>();
  storage->full = full.storage;
  storage->copies.resize(weight_bytes + (fp8 ? std::size_t(scale_rows * scale_cols) * 4 : 0));
  std::byte* at = storage->copies.data();
  copy_columns(o.weight, first * kOColsPerHead, cols, elem, at);
  shard.o_proj.weight = TensorView(at, o.weight.dtype(), {rows, cols});
  if (fp8) {
    copy_columns(o.scale_inv, first * kOColsPerHead / kWeightBlock, scale_cols, 4,
                 at + weight_bytes);
    shard.o_proj.scale_inv = TensorView(at + weight_bytes, DType::kF32, {scale_rows, scale_cols});
  }
  // An aliasing pointer: the shard's storage keeps both buffers alive.
  shard.storage = std::shared_ptr<std::vector<std::byte>>(storage, &storage->copies);
  return shard;
}

}  // namespace fp8mla
