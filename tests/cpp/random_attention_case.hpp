// A prefill_attention case of the random-shape agreement test, in the shared form (specs, init,
// run, describe): a ragged batch of drawn query and key lengths (empty sequences, one token,
// prefixes longer than the extension, fewer keys than queries), head count, e4m3 or bf16, causal
// or full, with or without the LSE, e4m3 V transposed or token-major, and padded strides within
// what the CUDA kernel takes (16-byte steps for q, k and v, even ones for out); the float64
// inputs of the reference (attention_reference.hpp) read back from the buffers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "buffer_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::test {

// Buffers: 0 q, 1 k, 2 v, 3 cu_seqlens_q, 4 cu_seqlens_k, 5 descales (q, k, v), 6 out, 7 lse.
struct RandomPrefillCase {
  bool fp8 = true;
  bool causal = true;
  bool with_lse = true;
  bool v_token_major = false;  // e4m3 only; bf16 V is always token-major
  int heads = 1;
  std::vector<int> q_lens{1}, k_lens{1};
  // Paddings in elements: q and k head rows (of 192) and tokens, in multiples of 16 bytes.
  std::int64_t qk_head_pad = 0, qk_token_pad = 0;
  std::int64_t v_head_pad = 0, v_token_pad = 0;  // token-major V, multiples of 16 bytes
  std::int64_t v_pitch_pad = 0;                  // transposed V: token pitch past round_up(Tk, 16)
  std::int64_t out_head_pad = 0, out_token_pad = 0;  // even
  bool lse_transposed = false;                       // [H, Tq] memory
  std::int64_t lse_pad = 0;
  float descales[3] = {0.3f, 0.3f, 0.5f};
  float scale_factor = 1.0f;  // softmax_scale = factor / sqrt(192)
  std::uint64_t seed = 1;

  static constexpr std::int64_t kDqk = kRefDqk, kDv = kRefDv;

  std::int64_t tq() const { return std::accumulate(q_lens.begin(), q_lens.end(), std::int64_t{0}); }
  std::int64_t tk() const { return std::accumulate(k_lens.begin(), k_lens.end(), std::int64_t{0}); }
  DType dtype() const { return fp8 ? DType::kE4M3 : DType::kBF16; }
  bool v_transposed() const { return fp8 && !v_token_major; }
  float softmax_scale() const { return float(scale_factor / std::sqrt(double(kDqk))); }

  // A token-major [n, H, d] spec with head rows d + head_pad and tokens padded by token_pad.
  Spec token_major(std::int64_t n, std::int64_t d, std::int64_t head_pad,
                   std::int64_t token_pad) const {
    const std::int64_t hs = d + head_pad, ts = heads * hs + token_pad;
    return {dtype(), {n, heads, d}, {ts, hs, 1}, 0, std::max<std::int64_t>(n * ts, 1)};
  }
  std::vector<Spec> specs() const {
    const std::int64_t q = tq(), k = tk(), h = heads, b = std::int64_t(q_lens.size());
    const std::int64_t pitch = round_up(std::max<std::int64_t>(k, 1), 16) + v_pitch_pad;
    const Spec v =
        v_transposed()
            ? Spec{DType::kE4M3, {k, h, kDv}, {1, kDv * pitch, pitch}, 0, h * kDv * pitch}
            : token_major(k, kDv, v_head_pad, v_token_pad);
    const std::int64_t ohs = kDv + out_head_pad, ots = h * ohs + out_token_pad;
    const Spec out{DType::kBF16, {q, h, kDv}, {ots, ohs, 1}, 0, std::max<std::int64_t>(q * ots, 1)};
    const Spec lse = lse_transposed ? Spec{DType::kF32,
                                           {q, h},
                                           {1, q + lse_pad},
                                           0,
                                           std::max<std::int64_t>(h * (q + lse_pad), 1)}
                                    : Spec{DType::kF32,
                                           {q, h},
                                           {h + lse_pad, 1},
                                           0,
                                           std::max<std::int64_t>(q * (h + lse_pad), 1)};
    return {token_major(q, kDqk, qk_head_pad, qk_token_pad),
            token_major(k, kDqk, qk_head_pad, qk_token_pad),
            v,
            dense(DType::kI32, {b + 1}),
            dense(DType::kI32, {b + 1}),
            dense(DType::kF32, {3}),
            out,
            lse};
  }

  static std::int64_t at(const Spec& s, std::int64_t t, std::int64_t h, std::int64_t i) {
    return s.offset + t * s.strides[0] + h * s.strides[1] + i * s.strides[2];
  }

  // Uniform values: e4m3 codes of [-8, 8] or bf16 of [-2.4, 2.4] (logits with a standard
  // deviation of about 2 at the default scales). Bytes no view element covers get noise.
  void init(std::vector<HostBuffer>& b) const {
    const std::vector<Spec> s = specs();
    Rng rng(seed);
    for (int i : {0, 1, 2}) {
      for (std::size_t j = 0; j < b[i].bytes(); ++j) b[i].data()[j] = std::uint8_t(rng.below(0x7F));
    }
    const float range = fp8 ? 8.0f : 2.4f;
    for (int i : {0, 1, 2}) {
      const std::int64_t n = i == 0 ? tq() : tk(), d = i == 2 ? kDv : kDqk;
      for (std::int64_t t = 0; t < n; ++t) {
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t e = 0; e < d; ++e) {
            const float x = (rng.uniform() * 2.0f - 1.0f) * range;
            const std::int64_t where = at(s[i], t, h, e);
            if (fp8) {
              b[i].data()[where] = encode_e4m3(x);
            } else {
              store_f32(b[i].data(), DType::kBF16, where, x);
            }
          }
        }
      }
    }
    std::vector<std::int32_t> cu_q{0}, cu_k{0};
    for (std::size_t i = 0; i < q_lens.size(); ++i) {
      cu_q.push_back(cu_q.back() + q_lens[i]);
      cu_k.push_back(cu_k.back() + k_lens[i]);
    }
    std::memcpy(b[3].data(), cu_q.data(), cu_q.size() * 4);
    std::memcpy(b[4].data(), cu_k.data(), cu_k.size() * 4);
    std::memcpy(b[5].data(), descales, sizeof descales);
  }

  PrefillAttentionArgs args(std::span<void* const> bases, Device device) const {
    const std::vector<Spec> s = specs();
    const auto v = [&](int i) { return s[std::size_t(i)].view(bases[std::size_t(i)], device); };
    PrefillAttentionArgs a;
    a.q = v(0);
    a.k = v(1);
    a.v = v(2);
    a.cu_seqlens_q = v(3);
    a.cu_seqlens_k = v(4);
    a.max_seqlen_q = *std::max_element(q_lens.begin(), q_lens.end());
    a.max_seqlen_k = *std::max_element(k_lens.begin(), k_lens.end());
    a.softmax_scale = softmax_scale();
    a.causal = causal;
    if (fp8) {
      char* d = static_cast<char*>(bases[5]);
      a.q_descale = TensorView(d, DType::kF32, {1}, device);
      a.k_descale = TensorView(d + 4, DType::kF32, {1}, device);
      a.v_descale = TensorView(d + 8, DType::kF32, {1}, device);
    }
    a.out = v(6);
    if (with_lse) a.lse = v(7);
    return a;
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    prefill_attention(args(bases, device), stream);
  }

  // The reference's float64 inputs, read from the (initial) buffers.
  AttentionInputs inputs(const std::vector<HostBuffer>& b) const {
    const std::vector<Spec> s = specs();
    AttentionInputs in;
    for (std::size_t i = 0; i < q_lens.size(); ++i) {
      in.cu_q.push_back(in.cu_q.back() + q_lens[i]);
      in.cu_k.push_back(in.cu_k.back() + k_lens[i]);
    }
    in.tq = tq();
    in.tk = tk();
    in.heads = heads;
    in.causal = causal;
    in.softmax_scale = double(softmax_scale());
    std::vector<double>* values[3] = {&in.q, &in.k, &in.v};
    for (int i : {0, 1, 2}) {
      const std::int64_t n = i == 0 ? tq() : tk(), d = i == 2 ? kDv : kDqk;
      const double descale = fp8 ? double(descales[i]) : 1.0;
      values[i]->resize(std::size_t(n * heads * d));
      for (std::int64_t t = 0; t < n; ++t) {
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t e = 0; e < d; ++e) {
            const std::int64_t where = at(s[i], t, h, e);
            const double x = fp8 ? double(decode_e4m3(b[i].data()[where])) * descale
                                 : double(load_f32(b[i].data(), DType::kBF16, where));
            (*values[i])[std::size_t((t * heads + h) * d + e)] = x;
          }
        }
      }
    }
    return in;
  }

  std::string describe() const {
    std::string lens;
    for (std::size_t b = 0; b < q_lens.size(); ++b) lens += concat(" ", q_lens[b], "/", k_lens[b]);
    return concat("prefill_attention ", fp8 ? "e4m3" : "bf16", causal ? " causal" : " full",
                  " H=", heads, " q/k lens", lens, with_lse ? ", LSE" : ", no LSE",
                  v_transposed()
                      ? concat(", V transposed (pitch pad ", v_pitch_pad, ")")
                      : concat(", V token-major (pads ", v_head_pad, "/", v_token_pad, ")"),
                  ", q/k pads ", qk_head_pad, "/", qk_token_pad, ", out pads ", out_head_pad, "/",
                  out_token_pad, lse_transposed ? ", LSE [H, T]" : ", LSE [T, H]", " pad ", lse_pad,
                  ", descales ", descales[0], "/", descales[1], "/", descales[2], ", scale x",
                  scale_factor, ", seed ", seed);
  }
};

}  // namespace fp8mla::test
