#include "model/prefix_chunks.hpp"

#include <algorithm>
#include <climits>

#include "fp8mla/error.hpp"

namespace fp8mla {

void plan_prefix_chunks(std::span<const std::int64_t> prefix_lens, std::int64_t capacity,
                        std::vector<PrefixChunk>& chunks) {
  if (capacity < 1 || capacity > INT32_MAX) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("plan_prefix_chunks: expected a capacity in [1, 2^31 - 1], got ", capacity));
  }
  const std::size_t batch = prefix_lens.size();
  for (std::size_t b = 0; b < batch; ++b) {
    if (prefix_lens[b] < 0) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("plan_prefix_chunks: prefix length of sequence ", b, " is ",
                         prefix_lens[b], "; expected >= 0"));
    }
  }
  std::size_t used = 0;
  std::size_t seq = 0;
  std::int64_t taken = 0;  // prefix tokens of `seq` already in earlier chunks
  auto skip_done = [&] {
    while (seq < batch && taken == prefix_lens[seq]) {
      ++seq;
      taken = 0;
    }
  };
  skip_done();
  while (seq < batch) {
    if (used == chunks.size()) chunks.emplace_back();
    PrefixChunk& chunk = chunks[used++];
    chunk.cu_seqlens_k.assign(batch + 1, 0);
    chunk.first_token.assign(batch, 0);
    chunk.max_seqlen_k = 0;
    std::int64_t room = capacity;
    for (std::size_t b = 0; b < batch; ++b) {
      std::int64_t n = 0;
      if (b == seq && room > 0) {
        n = std::min(room, prefix_lens[b] - taken);
        chunk.first_token[b] = taken;
        taken += n;
        room -= n;
        skip_done();
      }
      chunk.cu_seqlens_k[b + 1] = chunk.cu_seqlens_k[b] + std::int32_t(n);
      chunk.max_seqlen_k = std::max(chunk.max_seqlen_k, std::int32_t(n));
    }
  }
  chunks.resize(used);
}

}  // namespace fp8mla
