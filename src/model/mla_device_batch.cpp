// The plan of an MlaDeviceBatch (fp8mla/mla_layer.hpp): its views checked for what the host can
// see of them; on CUDA the plan points at them, on the CPU their contents are copied into the
// plan and checked as a host batch's. Prefixes are one chunk of every prefix key.
#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8mla/error.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {
namespace {

constexpr std::string_view kCaller = "MlaLayer::prefill (device batch)";

template <typename What>
void require(bool ok, What&& what) {
  if (!ok) throw Error(ErrorCategory::kInvalidArgument, concat(kCaller, ": ", what()));
}

void require_vector(const TensorView& t, DType dtype, std::int64_t size, const char* name,
                    Device device) {
  require(t.dtype() == dtype && t.ndim() == 1 && (size < 0 ? t.size(0) >= 1 : t.size(0) == size) &&
              t.is_contiguous() && t.device() == device,
          [&] {
            return concat("expected `", name, "` contiguous ", dtype_name(dtype), " [",
                          size < 0 ? std::string("B + 1") : concat(size), "] on ",
                          to_string(device), ", got ", t.describe());
          });
}

void check_shapes(const MlaDeviceBatch& b, Device device) {
  require(b.tokens >= 0 && b.max_seqlen_q >= 0 && b.prefix_tokens >= 0 && b.max_seqlen_prefix >= 0,
          [&] {
            return concat(
                "expected tokens, max_seqlen_q, prefix_tokens, max_seqlen_prefix >= 0, "
                "got ",
                b.tokens, ", ", b.max_seqlen_q, ", ", b.prefix_tokens, ", ", b.max_seqlen_prefix);
          });
  require_vector(b.cu_seqlens_q, DType::kI32, -1, "cu_seqlens_q", device);
  require_vector(b.positions, DType::kI64, b.tokens, "positions", device);
  require_vector(b.slot_mapping, DType::kI64, b.tokens, "slot_mapping", device);
  if (!b.has_prefix()) return;
  require_vector(b.cu_seqlens_prefix, DType::kI32, b.cu_seqlens_q.size(0), "cu_seqlens_prefix",
                 device);
  require_vector(b.prefix_slots, DType::kI64, b.prefix_tokens, "prefix_slots", device);
}

// Host offsets [B + 1] from 0 to at most `total` (named `total_name`), each run at most `longest`
// (named `longest_name`).
void read_offsets(const TensorView& t, const char* name, std::int64_t total, const char* total_name,
                  std::int32_t longest, const char* longest_name, std::vector<std::int32_t>& out) {
  const auto* v = t.data_as<const std::int32_t>();
  out.assign(v, v + t.size(0));
  require(out[0] == 0 && out.back() <= total, [&] {
    return concat("expected ", name, " from 0 to at most ", total_name, " ", total, ", got ",
                  out[0], " to ", out.back());
  });
  for (std::size_t b = 0; b + 1 < out.size(); ++b) {
    const std::int64_t n = std::int64_t(out[b + 1]) - out[b];
    require(n >= 0 && n <= longest, [&] {
      return concat("sequence ", b, ": expected 0 to ", longest_name, " ", longest, " in ", name,
                    ", got ", n);
    });
  }
}

// A CPU batch's contents into the plan, checked.
void read_host_batch(const MlaConfig& c, const MlaDeviceBatch& b, MlaBatchPlan& p) {
  read_offsets(b.cu_seqlens_q, "cu_seqlens_q", b.tokens, "tokens", b.max_seqlen_q, "max_seqlen_q",
               p.cu_q);
  const auto* pos = b.positions.data_as<const std::int64_t>();
  p.positions.assign(pos, pos + b.tokens);
  for (std::size_t i = 0; i < p.positions.size(); ++i) {
    require(p.positions[i] >= 0 && p.positions[i] < c.max_position, [&] {
      return concat("row ", i, ": expected a position in [0, ", c.max_position, "), got ",
                    p.positions[i]);
    });
  }
  const auto* slots = b.slot_mapping.data_as<const std::int64_t>();
  p.slots.assign(slots, slots + b.tokens);
  if (!b.has_prefix()) return;
  PrefixChunk& chunk = p.chunks.front();
  read_offsets(b.cu_seqlens_prefix, "cu_seqlens_prefix", b.prefix_tokens, "prefix_tokens",
               b.max_seqlen_prefix, "max_seqlen_prefix", chunk.cu_seqlens_k);
  const auto* rows = b.prefix_slots.data_as<const std::int64_t>();
  p.prefix_rows.assign(rows, rows + chunk.keys());  // the padding is never attended
  for (std::size_t i = 0; i + 1 < chunk.cu_seqlens_k.size(); ++i)
    p.prefix_lens.push_back(chunk.cu_seqlens_k[i + 1] - chunk.cu_seqlens_k[i]);
}

}  // namespace

void plan_mla_device_batch(const MlaConfig& c, const MlaDeviceBatch& b, Device device,
                           MlaBatchPlan& p) {
  check_shapes(b, device);
  // The reset of an empty host batch, which drops the chunks; kept aside, their vectors keep
  // their capacity, so that planning the same padded shape again allocates nothing.
  std::vector<PrefixChunk> chunks = std::move(p.chunks);
  plan_mla_batch(c, MlaBatch{}, MlaPrefillOptions{}, p, kCaller);
  p.chunks = std::move(chunks);
  p.chunks.resize(b.has_prefix() ? 1 : 0);
  p.tokens = b.tokens;
  p.sequences = b.cu_seqlens_q.size(0) - 1;
  p.max_q = b.max_seqlen_q;
  if (b.has_prefix()) {
    p.prefix_attention = PrefixAttention::kChunked;
    PrefixChunk& chunk = p.chunks.front();
    // On CUDA the offsets stay on the device; keys() is the padded count the buffers hold.
    chunk.cu_seqlens_k.assign(std::size_t(p.sequences + 1), std::int32_t(b.prefix_tokens));
    chunk.first_token.assign(std::size_t(p.sequences), 0);
    chunk.max_seqlen_k = b.max_seqlen_prefix;
    p.chunk_first_row.assign(1, 0);
  }
  if (device.is_cuda()) {
    p.device = &b;
    return;
  }
  read_host_batch(c, b, p);
}

}  // namespace fp8mla
