// A layer test fixture's batch as the metadata of an MlaDeviceBatch, padded to more rows: the
// rows past the sequences get random hidden states, position 0 and slot -1, so that a test sees
// whether padding leaks into the real rows; with prefixes, their slots padded with -1.
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
  std::vector<std::int32_t> cu_seqlens_prefix;  // empty: no prefixes
  std::vector<std::int64_t> prefix_slots;
  std::int64_t prefix_tokens = 0;
  std::int32_t max_seqlen_prefix = 0;
};

// prefix_tokens 0: no prefixes (every sequence's must be 0).
inline PaddedBatch pad_batch(const Fixture& f, std::int64_t tokens, std::int32_t max_seqlen_q,
                             std::uint32_t seed, std::int64_t prefix_tokens = 0,
                             std::int32_t max_seqlen_prefix = 0) {
  PaddedBatch p;
  p.tokens = tokens;
  p.max_seqlen_q = max_seqlen_q;
  p.prefix_tokens = prefix_tokens;
  p.max_seqlen_prefix = max_seqlen_prefix;
  p.cu_seqlens_q.push_back(0);
  if (prefix_tokens > 0) p.cu_seqlens_prefix.push_back(0);
  for (const MlaSequence& s : f.batch.sequences) {
    EXPECT_TRUE(prefix_tokens > 0 || s.prefix == 0) << "prefixes need prefix_tokens";
    for (std::int64_t i = 0; i < s.extend; ++i) {
      p.positions.push_back(s.prefix + i);
      p.slots.push_back(s.slots[std::size_t(s.prefix + i)]);
    }
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + std::int32_t(s.extend));
    if (prefix_tokens == 0) continue;
    p.prefix_slots.insert(p.prefix_slots.end(), s.slots.begin(), s.slots.begin() + s.prefix);
    p.cu_seqlens_prefix.push_back(p.cu_seqlens_prefix.back() + std::int32_t(s.prefix));
  }
  EXPECT_LE(std::int64_t(p.prefix_slots.size()), prefix_tokens);
  p.prefix_slots.resize(std::size_t(prefix_tokens), -1);
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

// Host options under which the host batch takes the device batch's prefix attention: every
// prefix key in one chunk, merged by LSE.
inline MlaPrefillOptions one_prefix_chunk() {
  MlaPrefillOptions o;
  o.one_shot_max_prefix = 0;
  o.chunk_capacity = std::int64_t(1) << 30;
  return o;
}

}  // namespace fp8mla
