// A layer test fixture's batch (sequences without a cached prefix) as the metadata of an
// MlaDeviceBatch, padded to more rows: the rows past the sequences get random hidden states,
// position 0 and slot -1, so that a test sees whether padding leaks into the real rows.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "mla_layer_test_util.hpp"

namespace fp8mla {

struct PaddedBatch {
  std::vector<std::int32_t> cu_seqlens_q;
  std::vector<std::int64_t> positions, slots;
  std::vector<std::uint16_t> hidden;  // [tokens, hidden]
  std::int64_t tokens = 0;
  std::int32_t max_seqlen_q = 0;
};

inline PaddedBatch pad_batch(const Fixture& f, std::int64_t tokens, std::int32_t max_seqlen_q,
                             std::uint32_t seed) {
  PaddedBatch p;
  p.tokens = tokens;
  p.max_seqlen_q = max_seqlen_q;
  p.cu_seqlens_q.push_back(0);
  for (const MlaSequence& s : f.batch.sequences) {
    EXPECT_EQ(s.prefix, 0) << "a device batch has no cached prefix";
    for (std::int64_t i = 0; i < s.extend; ++i) {
      p.positions.push_back(i);
      p.slots.push_back(s.slots[std::size_t(i)]);
    }
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + std::int32_t(s.extend));
  }
  EXPECT_LE(std::int64_t(p.positions.size()), tokens);
  p.positions.resize(std::size_t(tokens), 0);
  p.slots.resize(std::size_t(tokens), -1);
  p.hidden = f.hidden;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.hidden.resize(std::size_t(tokens * f.config.hidden));
  for (std::size_t i = f.hidden.size(); i < p.hidden.size(); ++i)
    p.hidden[i] = encode_bf16(normal(rng));
  return p;
}

}  // namespace fp8mla
