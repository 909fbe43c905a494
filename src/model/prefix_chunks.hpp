// The plan of chunked prefix attention (docs/design.md section 5): the cached prefixes of a batch
// split into chunks of at most `capacity` keys. Each chunk is one ragged key batch over the same
// sequences as the queries: sequence b contributes a contiguous run of its prefix tokens (maybe
// none, which the attention answers with O = 0, LSE = -inf and the merge then ignores).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fp8mla {

struct PrefixChunk {
  std::vector<std::int32_t> cu_seqlens_k;  // [batch + 1] offsets of each sequence's keys
  std::vector<std::int64_t> first_token;   // [batch] sequence-local index of its first key here
  std::int32_t max_seqlen_k = 0;
  std::int64_t keys() const { return cu_seqlens_k.back(); }
};

// Fills `chunks` greedily in sequence order, so every chunk but the last holds exactly `capacity`
// keys and a long prefix spans several chunks; no prefix gives no chunk. The chunks' vectors are
// reused (a layer plans every batch into the same ones). Prefix lengths must be >= 0 and capacity
// >= 1 (ErrorCategory::kInvalidArgument otherwise).
void plan_prefix_chunks(std::span<const std::int64_t> prefix_lens, std::int64_t capacity,
                        std::vector<PrefixChunk>& chunks);

}  // namespace fp8mla
