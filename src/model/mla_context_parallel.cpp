// Context parallelism's batch split (fp8mla/mla_layer.hpp, docs/parallelism.md): each sequence's
// extend tokens in 2N zigzag chunks, and the plan of the latent rows' all-gather.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {
namespace {

using Range = std::pair<std::int64_t, std::int64_t>;  // [first, end) of a sequence's extend tokens

// Rank q's chunks of `extend` tokens: chunks q and 2N - 1 - q of 2N, chunk c starting at
// c * extend / 2N. Rank N - 1's two are adjacent and make one range; empty ones are dropped.
std::array<Range, 2> rank_chunks(std::int64_t extend, int n, int q) {
  const auto at = [&](std::int64_t c) { return c * extend / (2 * std::int64_t(n)); };
  const std::int64_t mirror = 2 * std::int64_t(n) - 1 - q;
  if (q == n - 1) return {Range{at(q), at(q + 2)}, Range{0, 0}};
  return {Range{at(q), at(q + 1)}, Range{at(mirror), at(mirror + 1)}};
}

// Rank q's share: its chunks as sequences, its tokens' rows of the full batch and their slots.
void split_rank(const MlaBatch& full, int n, int q, MlaBatch* batch,
                std::vector<std::int64_t>* tokens, std::vector<std::int64_t>& slots) {
  std::int64_t row = 0;  // the sequence's first row among the full batch's extend tokens
  for (const MlaSequence& s : full.sequences) {
    for (const auto& [first, end] : rank_chunks(s.extend, n, q)) {
      if (end == first) continue;
      const auto slot = [&](std::int64_t i) { return s.slots[std::size_t(s.prefix + i)]; };
      for (std::int64_t i = first; i < end; ++i) {
        slots.push_back(slot(i));
        if (tokens != nullptr) tokens->push_back(row + i);
      }
      if (batch != nullptr) {
        batch->sequences.push_back(
            {s.prefix + first, end - first,
             std::vector<std::int64_t>(s.slots.begin(), s.slots.begin() + (s.prefix + end))});
      }
    }
    row += s.extend;
  }
}

}  // namespace

MlaContextParallelBatch mla_context_parallel_batch(const MlaBatch& full, MlaContextParallel cp) {
  if (cp.size < 1 || cp.rank < 0 || cp.rank >= cp.size) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("mla_context_parallel_batch: expected size >= 1 and 0 <= rank < size, got "
                       "rank ",
                       cp.rank, " of ", cp.size));
  }
  for (std::size_t b = 0; b < full.sequences.size(); ++b) {
    const MlaSequence& s = full.sequences[b];
    if (s.prefix < 0 || s.extend < 0 || std::int64_t(s.slots.size()) != s.prefix + s.extend) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("mla_context_parallel_batch: sequence ", b,
                         ": expected prefix, extend >= 0 and prefix + extend slots; got prefix ",
                         s.prefix, ", extend ", s.extend, ", ", s.slots.size(), " slots"));
    }
  }
  MlaContextParallelBatch r;
  r.cp = cp;
  std::vector<std::vector<std::int64_t>> slots(std::size_t(cp.size));
  for (int q = 0; q < cp.size; ++q) {
    const bool mine = q == cp.rank;
    split_rank(full, cp.size, q, mine ? &r.batch : nullptr, mine ? &r.tokens : nullptr,
               slots[std::size_t(q)]);
    r.rows_per_rank = std::max(r.rows_per_rank, std::int64_t(slots[std::size_t(q)].size()));
  }
  r.gathered_slots.assign(std::size_t(cp.size * r.rows_per_rank), -1);
  for (int q = 0; q < cp.size; ++q) {
    std::ranges::copy(slots[std::size_t(q)],
                      r.gathered_slots.begin() + std::ptrdiff_t(q * r.rows_per_rank));
  }
  return r;
}

MlaWorkspaceLimits MlaContextParallelBatch::workspace_limits() const {
  MlaWorkspaceLimits l;
  l.max_tokens = batch.extend_tokens();
  l.max_sequences = std::int64_t(batch.sequences.size());
  for (const MlaSequence& s : batch.sequences) l.max_prefix_tokens += s.prefix;
  l.max_gathered_rows = std::int64_t(gathered_slots.size());
  return l;
}

void plan_mla_gather(const MlaContextParallelBatch& batch, MlaBatchPlan& p) {
  const std::int64_t R = batch.rows_per_rank, own = batch.cp.rank * R;
  p.gather_rank = batch.cp.rank;
  p.gather_ranks = batch.cp.size;
  p.gather_rows_per_rank = R;
  p.pack_rows.assign(std::size_t(R), -1);
  std::copy(batch.gathered_slots.begin() + own, batch.gathered_slots.begin() + own + R,
            p.pack_rows.begin());
  p.unpack_rows = batch.gathered_slots;
  std::fill(p.unpack_rows.begin() + own, p.unpack_rows.begin() + own + R, -1);
}

}  // namespace fp8mla
