// The kernels on views whose element offsets pass 2^31 (64-bit addressing), the ops that
// quantize_cuda_test (static per-tensor by value, per-token-group, NVFP4) and mla_kv_cuda_test
// (cache write and gather past 2 GiB) do not already cover: dynamic and from-memory per-tensor
// FP8 of more than 2^31 elements, and RoPE + FP8 (with its cache write), the K/V pack, the V
// quantization, prefill_attention and the merge on a few tokens whose token or dim strides put
// their last rows past element 2^31, and the fused output quantization of the attention and the
// merge into an out and scales whose row strides do. Only the touched rows are written and read
// back (a pitched copy), and they are compared with the same op on compact copies of those rows:
// the CPU op, bit for bit, for the prep and quantize ops; the CUDA op on small offsets for
// attention and the merge (whose CPU paths differ from the kernels within the error rule, not bit
// for bit), so a 32-bit offset anywhere shows as different bytes. Attention and the merge also run
// on enough tokens (128 heads) that the last sequences' rows start past element 2^31. Each test
// holds at most about 26 GB of device memory at a time. Test names contain "Big"
// (--gtest_filter='*Big*' selects them).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla::test {
namespace {

constexpr std::int64_t k2To31 = std::int64_t{1} << 31;
constexpr std::int64_t kTokens = 64, kHeads = 2;

// The smallest multiple of 16 elements that puts row `rows - 1` past element 2^31.
std::int64_t pitch_past_2_31(std::int64_t rows) {
  return round_up(k2To31 / (rows - 1) + 1, 16);
}

void device_sync() {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// `rows` rows of `row_bytes` bytes, `pitch` bytes apart, in one poisoned device allocation: only
// the rows are copied in and out, against compact host rows (one copy a row: cudaMemcpy2D
// rejects pitches past the device's memPitch, 2^31 - 1 bytes).
class PitchedRows {
 public:
  PitchedRows(std::int64_t rows, std::size_t row_bytes, std::size_t pitch)
      : rows_(rows),
        row_bytes_(row_bytes),
        pitch_(pitch),
        buffer_(std::size_t(rows - 1) * pitch + row_bytes) {}
  void* data() const { return buffer_.data(); }
  void upload(const HostBuffer& compact) {
    for (std::int64_t r = 0; r < rows_; ++r) {
      cuda::check(cudaMemcpy(static_cast<char*>(buffer_.data()) + std::size_t(r) * pitch_,
                             compact.data() + std::size_t(r) * row_bytes_, row_bytes_,
                             cudaMemcpyHostToDevice),
                  "cudaMemcpy");
    }
  }
  HostBuffer download() const {
    HostBuffer compact(row_bytes_ * std::size_t(rows_));
    for (std::int64_t r = 0; r < rows_; ++r) {
      const std::vector<std::uint8_t> row = buffer_.download(std::size_t(r) * pitch_, row_bytes_);
      std::memcpy(compact.data() + std::size_t(r) * row_bytes_, row.data(), row_bytes_);
    }
    return compact;
  }
  void poison() { buffer_.fill(kPoison); }
  bool intact() const { return bool(buffer_.guards_intact()); }

 private:
  std::int64_t rows_;
  std::size_t row_bytes_, pitch_;
  DeviceBuffer buffer_;
};

// Compact host rows of uniform bf16 values in [-range, range].
HostBuffer uniform_bf16_rows(std::int64_t n, float range, std::uint64_t seed) {
  HostBuffer host(std::size_t(n) * 2);
  Rng rng(seed);
  for (std::int64_t i = 0; i < n; ++i) {
    store_f32(host.data(), DType::kBF16, i, (rng.uniform() * 2.0f - 1.0f) * range);
  }
  return host;
}

HostBuffer copy_of(const void* data, std::size_t bytes) {
  HostBuffer host(bytes);
  std::memcpy(host.data(), data, bytes);
  return host;
}

// ---- Per-tensor FP8 of more than 2^31 elements ----------------------------------------------

// Values in (-1, 1) from a hash of the 64-bit index; one element past 2^31 is 300, the amax.
__global__ void fill_below_one(std::uint16_t* out, std::int64_t n, std::int64_t planted) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = std::uint64_t(i) * 0x9E3779B97F4A7C15ull + 77;
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
    // bf16 exponents 100..126 (2^-27 .. 0.99), any mantissa and sign.
    const std::uint32_t exponent = 100u + std::uint32_t(z >> 40) % 27u;
    out[i] = i == planted ? std::uint16_t(0x4396)  // 300.0
                          : std::uint16_t((z & 0x807Fu) | (exponent << 7));
  }
}

TEST(BigTensorCuda, QuantizeFp8DynamicAndFromMemoryPast2To31Elements) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kRows = (std::int64_t{1} << 21) + 3, kCols = 1030;
  const std::int64_t n = kRows * kCols, planted = k2To31 + 12345;
  static_assert(kRows * kCols > k2To31);
  DeviceBuffer input(std::size_t(n) * 2), out{std::size_t(n)}, scale{4};
  fill_below_one<<<cuda::device_props(0).sm_count * 8, 256>>>(input.as<std::uint16_t>(), n,
                                                              planted);
  cuda::check_launch("fill_below_one");
  const Device gpu = Device::cuda(0);
  const TensorView in_view(input.data(), DType::kBF16, {kRows, kCols}, gpu);
  const TensorView out_view(out.data(), DType::kE4M3, {kRows, kCols}, gpu);
  const TensorView scale_view(scale.data(), DType::kF32, {1}, gpu);
  const std::int64_t planted_row = planted / kCols;
  const std::int64_t bands[] = {0, k2To31 / kCols - 2, planted_row - 1, kRows - 4};
  const auto expect_bands = [&](float scale_inv, const char* what) {
    for (std::int64_t first : bands) {
      SCOPED_TRACE(concat(what, ", rows ", first, " + 4"));
      const std::size_t row_bytes = std::size_t(kCols) * 2;
      const std::vector<std::uint8_t> in_rows = input.download(first * row_bytes, 4 * row_bytes);
      HostBuffer host_in = copy_of(in_rows.data(), in_rows.size()), want(4 * std::size_t(kCols));
      quantize_fp8(TensorView(host_in.data(), DType::kBF16, {4, kCols}),
                   TensorView(want.data(), DType::kE4M3, {4, kCols}), scale_inv);
      EXPECT_TRUE(same_bytes(out.download(std::size_t(first * kCols), want.bytes()), want.payload(),
                             "out"));
    }
  };
  quantize_fp8_dynamic(in_view, out_view, scale_view);
  device_sync();
  float got_scale = 0.0f;
  std::memcpy(&got_scale, scale.download().data(), 4);
  // The amax sits past element 2^31: a reduction that stops or wraps there gives a scale < 1/448.
  ASSERT_EQ(got_scale, 300.0f / 448.0f);
  expect_bands(1.0f / got_scale, "dynamic");
  const float from_memory = 3.5f;
  scale.upload(&from_memory);
  out.fill(kPoison);
  quantize_fp8(in_view, out_view, scale_view);
  device_sync();
  expect_bands(from_memory, "static from memory");
  EXPECT_TRUE(out.guards_intact());
}

// A small input (the dynamic scale's one-launch path) whose row stride puts its last row past
// element 2^31, into an out whose row stride does too: the bytes and scale of the compact rows.
TEST(BigTensorCuda, QuantizeFp8DynamicOneLaunchRowStridesPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kRows = 3, kCols = 7168;  // 21504 elements: the one-launch path
  const std::int64_t in_stride = pitch_past_2_31(kRows), out_stride = pitch_past_2_31(kRows);
  const HostBuffer x = uniform_bf16_rows(kRows * kCols, 37.0f, 51);
  PitchedRows d_in(kRows, std::size_t(kCols) * 2, std::size_t(in_stride) * 2),
      d_out(kRows, std::size_t(kCols), std::size_t(out_stride));
  d_in.upload(x);
  DeviceBuffer scale{4};
  const Device gpu = Device::cuda(0);
  quantize_fp8_dynamic(TensorView(d_in.data(), DType::kBF16, {kRows, kCols}, {in_stride, 1}, gpu),
                       TensorView(d_out.data(), DType::kE4M3, {kRows, kCols}, {out_stride, 1}, gpu),
                       TensorView(scale.data(), DType::kF32, {1}, gpu));
  device_sync();
  HostBuffer want(std::size_t(kRows * kCols)), want_scale(4),
      host_in = copy_of(x.data(), x.bytes());
  quantize_fp8_dynamic(TensorView(host_in.data(), DType::kBF16, {kRows, kCols}),
                       TensorView(want.data(), DType::kE4M3, {kRows, kCols}),
                       TensorView(want_scale.data(), DType::kF32, {1}));
  EXPECT_TRUE(same_bytes(d_out.download().payload(), want.payload(), "out"));
  EXPECT_TRUE(same_bytes(scale.download(), want_scale.payload(), "scale"));
  EXPECT_TRUE(d_out.intact());
}

// ---- RoPE + FP8 with its cache write ---------------------------------------------------------

TEST(BigTensorCuda, RopeQuantizeTokenStridesAndCachePast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  const std::int64_t T = kTokens, H = 16, max_pos = 4096;
  const std::int64_t in_stride = pitch_past_2_31(T);   // q_nope / k_nope token stride, elements
  const std::int64_t out_stride = pitch_past_2_31(T);  // q_out / k_out token stride, bytes
  const std::int64_t page_size = 64, pages = k2To31 / (page_size * 576) + 8;
  const std::int64_t capacity = pages * page_size;
  // Compact host inputs of T rows.
  HostBuffer q_nope = uniform_bf16_rows(T * H * 128, 3.0f, 1),
             q_pe = uniform_bf16_rows(T * H * 64, 3.0f, 2),
             k_nope = uniform_bf16_rows(T * H * 128, 3.0f, 3),
             k_pe = uniform_bf16_rows(T * 64, 3.0f, 4), kv_c = uniform_bf16_rows(T * 512, 3.0f, 5),
             positions(std::size_t(T) * 8), cos_sin(std::size_t(max_pos) * 64 * 4),
             slots(std::size_t(T) * 8), compact_slots(std::size_t(T) * 8);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t pos = (t * 997) % max_pos, slot = capacity - 1 - t * 3;
    std::memcpy(positions.data() + t * 8, &pos, 8);
    std::memcpy(slots.data() + t * 8, &slot, 8);
    std::memcpy(compact_slots.data() + t * 8, &t, 8);
  }
  RopeConfig config;
  config.yarn = YarnScaling{};
  make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {max_pos, 64}), config);

  PitchedRows d_q_nope(T, H * 128 * 2, std::size_t(in_stride) * 2),
      d_k_nope(T, H * 128 * 2, std::size_t(in_stride) * 2), d_q_out(T, H * 192, out_stride),
      d_k_out(T, H * 192, out_stride);
  d_q_nope.upload(q_nope);
  d_k_nope.upload(k_nope);
  DeviceBuffer d_q_pe(q_pe.bytes()), d_k_pe(k_pe.bytes()), d_kv_c(kv_c.bytes()),
      d_pos(positions.bytes()), d_cos(cos_sin.bytes()), d_slots(slots.bytes()),
      d_cache(std::size_t(capacity) * 576), flag(4, 0);
  for (auto [d, h] : {std::pair{&d_q_pe, &q_pe},
                      {&d_k_pe, &k_pe},
                      {&d_kv_c, &kv_c},
                      {&d_pos, &positions},
                      {&d_cos, &cos_sin},
                      {&d_slots, &slots}}) {
    d->upload(h->data());
  }
  const auto args = [&](void* qn, std::int64_t qn_stride, void* qpe, void* kn, void* kpe, void* kvc,
                        void* pos, void* cs, void* qo, void* ko, std::int64_t o_stride, void* cache,
                        std::int64_t cache_pages, void* sl, void* fl, Device d) {
    MlaRopeQuantizeArgs a;
    a.q_nope = TensorView(qn, DType::kBF16, {T, H, 128}, {qn_stride, 128, 1}, d);
    a.q_pe = TensorView(qpe, DType::kBF16, {T, H, 64}, d);
    a.k_nope = TensorView(kn, DType::kBF16, {T, H, 128}, {qn_stride, 128, 1}, d);
    a.k_pe = TensorView(kpe, DType::kBF16, {T, 64}, d);
    a.positions = TensorView(pos, DType::kI64, {T}, d);
    a.cos_sin = TensorView(cs, DType::kF32, {max_pos, 64}, d);
    a.q_scale_inv = 2.0f;
    a.k_scale_inv = 0.5f;
    a.q_out = TensorView(qo, DType::kE4M3, {T, H, 192}, {o_stride, 192, 1}, d);
    a.k_out = TensorView(ko, DType::kE4M3, {T, H, 192}, {o_stride, 192, 1}, d);
    a.cache_write = LatentCacheWrite{
        TensorView(cache, DType::kE4M3, {cache_pages, page_size, 576}, d),
        TensorView(sl, DType::kI64, {T}, d), 4.0f, TensorView(fl, DType::kI32, {1}, d)};
    a.kv_c = TensorView(kvc, DType::kBF16, {T, 512}, d);
    return a;
  };
  mla_rope_quantize_fp8(args(d_q_nope.data(), in_stride, d_q_pe.data(), d_k_nope.data(),
                             d_k_pe.data(), d_kv_c.data(), d_pos.data(), d_cos.data(),
                             d_q_out.data(), d_k_out.data(), out_stride, d_cache.data(), pages,
                             d_slots.data(), flag.data(), Device::cuda(0)));
  device_sync();
  // The CPU op on compact rows, the cache of T slots 0..T-1 in place of capacity - 1 - 3t.
  HostBuffer q_out(std::size_t(T * H * 192)), k_out(std::size_t(T * H * 192)),
      cache(std::size_t(T) * 576), host_flag(4, 0);
  mla_rope_quantize_fp8(args(q_nope.data(), H * 128, q_pe.data(), k_nope.data(), k_pe.data(),
                             kv_c.data(), positions.data(), cos_sin.data(), q_out.data(),
                             k_out.data(), H * 192, cache.data(), T / page_size,
                             compact_slots.data(), host_flag.data(), Device::cpu()));
  EXPECT_TRUE(same_bytes(d_q_out.download().payload(), q_out.payload(), "q_out"));
  EXPECT_TRUE(same_bytes(d_k_out.download().payload(), k_out.payload(), "k_out"));
  for (std::int64_t t = 0; t < T; ++t) {
    EXPECT_TRUE(same_bytes(d_cache.download(std::size_t(capacity - 1 - t * 3) * 576, 576),
                           std::span(cache.data() + t * 576, 576),
                           concat("cache row of token ", t)));
  }
  EXPECT_EQ(flag.download_as<std::int32_t>()[0], 0);
  EXPECT_TRUE(d_q_out.intact() && d_k_out.intact() && d_cache.guards_intact());
}

// ---- K/V pack and V quantization -------------------------------------------------------------

// k_nope and v token strides, k_out's token stride and the transposed v_out's dim stride each put
// the last row past element 2^31.
TEST(BigTensorCuda, KvPackAndVQuantizeStridesPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  const std::int64_t n = kTokens, H = kHeads;
  const std::int64_t in_stride = pitch_past_2_31(n), k_out_stride = pitch_past_2_31(n);
  const std::int64_t v_pitch = pitch_past_2_31(H * 128);
  HostBuffer k_nope = uniform_bf16_rows(n * H * 128, 3.0f, 11),
             v = uniform_bf16_rows(n * H * 128, 3.0f, 12),
             k_pe = uniform_bf16_rows(n * 64, 3.0f, 13);
  PitchedRows d_k_nope(n, H * 128 * 2, std::size_t(in_stride) * 2),
      d_v(n, H * 128 * 2, std::size_t(in_stride) * 2), d_k_out(n, H * 192, k_out_stride),
      d_v_out(H * 128, std::size_t(n), v_pitch);
  d_k_nope.upload(k_nope);
  d_v.upload(v);
  DeviceBuffer d_k_pe(k_pe.bytes());
  d_k_pe.upload(k_pe.data());
  const auto pack_args = [&](void* kn, void* vv, std::int64_t in_ts, void* kpe, void* ko,
                             std::int64_t ko_ts, void* vo, std::int64_t pitch, Device d) {
    MlaKvPackArgs a;
    a.k_nope = TensorView(kn, DType::kBF16, {n, H, 128}, {in_ts, 128, 1}, d);
    a.k_pe = TensorView(kpe, DType::kBF16, {n, 64}, d);
    a.v = TensorView(vv, DType::kBF16, {n, H, 128}, {in_ts, 128, 1}, d);
    a.k_scale_inv = 2.0f;
    a.v_scale_inv = 0.5f;
    a.k_out = TensorView(ko, DType::kE4M3, {n, H, 192}, {ko_ts, 192, 1}, d);
    a.v_out = TensorView(vo, DType::kE4M3, {n, H, 128}, {1, 128 * pitch, pitch}, d);
    a.v_layout = VLayout::kTransposed;
    return a;
  };
  const MlaKvPackArgs gpu =
      pack_args(d_k_nope.data(), d_v.data(), in_stride, d_k_pe.data(), d_k_out.data(), k_out_stride,
                d_v_out.data(), v_pitch, Device::cuda(0));
  mla_kv_pack_quantize_fp8(gpu);
  device_sync();
  HostBuffer k_out(std::size_t(n * H * 192)), v_out(std::size_t(n * H * 128));
  const MlaKvPackArgs cpu = pack_args(k_nope.data(), v.data(), H * 128, k_pe.data(), k_out.data(),
                                      H * 192, v_out.data(), n, Device::cpu());
  mla_kv_pack_quantize_fp8(cpu);
  EXPECT_TRUE(same_bytes(d_k_out.download().payload(), k_out.payload(), "k_out"));
  EXPECT_TRUE(same_bytes(d_v_out.download().payload(), v_out.payload(), "v_out (pack)"));

  d_v_out.poison();
  mla_v_quantize_fp8(gpu.v, gpu.v_out, 0.25f, VLayout::kTransposed);
  device_sync();
  mla_v_quantize_fp8(cpu.v, cpu.v_out, 0.25f, VLayout::kTransposed);
  EXPECT_TRUE(same_bytes(d_v_out.download().payload(), v_out.payload(), "v_out (V alone)"));
  EXPECT_TRUE(d_k_out.intact() && d_v_out.intact());
}

// ---- prefill_attention and the merge ----------------------------------------------------------

// Compact random host rows: e4m3 codes of [-8, 8] or bf16 of [-2.4, 2.4].
HostBuffer attention_rows(std::int64_t n, bool fp8, std::uint64_t seed) {
  if (!fp8) return uniform_bf16_rows(n, 2.4f, seed);
  HostBuffer host{std::size_t(n)};
  Rng rng(seed);
  for (std::int64_t i = 0; i < n; ++i) host.data()[i] = encode_e4m3((rng.uniform() * 2 - 1) * 8);
  return host;
}

DeviceBuffer compact_copy(const HostBuffer& host) {
  DeviceBuffer d(host.bytes());
  d.upload(host.data());
  return d;
}

// q and k token strides, V's (transposed e4m3: dim; bf16: token) stride, out's token stride and
// the LSE's token stride past element 2^31; two sequences. Bytes equal to the same call on
// compact copies.
void expect_big_prefill_equals_compact(bool fp8) {
  SCOPED_TRACE(fp8 ? "e4m3, V transposed" : "bf16");
  const std::int64_t T = kTokens, H = kHeads, eb = fp8 ? 1 : 2;
  const DType dtype = fp8 ? DType::kE4M3 : DType::kBF16;
  const std::int64_t qk_stride = pitch_past_2_31(T), out_stride = pitch_past_2_31(T);
  const std::int64_t lse_stride = pitch_past_2_31(T);
  const std::int64_t v_rows = fp8 ? H * 128 : T, v_stride = pitch_past_2_31(v_rows);
  const HostBuffer q = attention_rows(T * H * 192, fp8, 21),
                   k = attention_rows(T * H * 192, fp8, 22),
                   v = attention_rows(T * H * 128, fp8,
                                      23);  // compact v: [H][128][T] or [T][H][128]
  PitchedRows d_q(T, std::size_t(H * 192 * eb), std::size_t(qk_stride * eb)),
      d_k(T, std::size_t(H * 192 * eb), std::size_t(qk_stride * eb)),
      d_v(v_rows, v.bytes() / std::size_t(v_rows), std::size_t(v_stride * eb)),
      d_out(T, H * 128 * 2, std::size_t(out_stride) * 2),
      d_lse(T, H * 4, std::size_t(lse_stride) * 4);
  d_q.upload(q);
  d_k.upload(k);
  d_v.upload(v);
  const DeviceBuffer c_q = compact_copy(q), c_k = compact_copy(k), c_v = compact_copy(v);
  DeviceBuffer c_out(std::size_t(T * H * 128 * 2)), c_lse(std::size_t(T * H * 4));
  const DeviceBuffer cu = to_device(std::vector<std::int32_t>{0, 30, 64});
  const DeviceBuffer descales = to_device(std::vector<float>{0.3f, 0.3f, 0.5f});
  const Device gpu = Device::cuda(0);
  const auto args = [&](void* qq, void* kk, void* vv, void* o, void* l, std::int64_t qk_ts,
                        std::int64_t v_s, std::int64_t o_ts, std::int64_t l_ts) {
    PrefillAttentionArgs a;
    a.q = TensorView(qq, dtype, {T, H, 192}, {qk_ts, 192, 1}, gpu);
    a.k = TensorView(kk, dtype, {T, H, 192}, {qk_ts, 192, 1}, gpu);
    a.v = fp8 ? TensorView(vv, dtype, {T, H, 128}, {1, 128 * v_s, v_s}, gpu)
              : TensorView(vv, dtype, {T, H, 128}, {v_s, 128, 1}, gpu);
    a.cu_seqlens_q = a.cu_seqlens_k = TensorView(cu.data(), DType::kI32, {3}, gpu);
    a.max_seqlen_q = a.max_seqlen_k = 34;
    a.softmax_scale = float(1.0 / std::sqrt(192.0));
    if (fp8) {
      a.q_descale = TensorView(descales.as<float>(), DType::kF32, {1}, gpu);
      a.k_descale = TensorView(descales.as<float>() + 1, DType::kF32, {1}, gpu);
      a.v_descale = TensorView(descales.as<float>() + 2, DType::kF32, {1}, gpu);
    }
    a.out = TensorView(o, DType::kBF16, {T, H, 128}, {o_ts, 128, 1}, gpu);
    a.lse = TensorView(l, DType::kF32, {T, H}, {l_ts, 1}, gpu);
    return a;
  };
  prefill_attention(args(d_q.data(), d_k.data(), d_v.data(), d_out.data(), d_lse.data(), qk_stride,
                         v_stride, out_stride, lse_stride));
  prefill_attention(args(c_q.data(), c_k.data(), c_v.data(), c_out.data(), c_lse.data(), H * 192,
                         fp8 ? T : H * 128, H * 128, H));
  device_sync();
  EXPECT_TRUE(same_bytes(d_out.download().payload(), c_out.download(), "out"));
  EXPECT_TRUE(same_bytes(d_lse.download().payload(), c_lse.download(), "lse"));
  EXPECT_TRUE(d_out.intact() && d_lse.intact());
}

TEST(BigTensorCuda, PrefillAttentionStridesPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  expect_big_prefill_equals_compact(true);
  expect_big_prefill_equals_compact(false);
}

// o_a, o_b and out token strides and lse_b's head stride (a transposed [H, T] buffer) past
// element 2^31. Bytes equal to the merge of compact copies.
TEST(BigTensorCuda, MergeAttentionStatesStridesPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  const std::int64_t T = kTokens, H = kHeads, D = 128;
  const std::int64_t o_stride = pitch_past_2_31(T), lse_b_stride = round_up(k2To31 + 1, 16);
  const HostBuffer o_a = uniform_bf16_rows(T * H * D, 4.0f, 31),
                   o_b = uniform_bf16_rows(T * H * D, 4.0f, 32);
  HostBuffer lse_a(std::size_t(T * H) * 4), lse_b(std::size_t(T * H) * 4);  // lse_b as [H][T]
  Rng rng(33);
  for (std::int64_t i = 0; i < T * H; ++i) {
    store_f32(lse_a.data(), DType::kF32, i, (rng.uniform() * 2 - 1) * 20);
    store_f32(lse_b.data(), DType::kF32, i, (rng.uniform() * 2 - 1) * 20);
  }
  PitchedRows d_o_a(T, H * D * 2, std::size_t(o_stride) * 2),
      d_o_b(T, H * D * 2, std::size_t(o_stride) * 2),
      d_out(T, H * D * 2, std::size_t(o_stride) * 2),
      d_lse_b(H, std::size_t(T) * 4, std::size_t(lse_b_stride) * 4);
  d_o_a.upload(o_a);
  d_o_b.upload(o_b);
  d_lse_b.upload(lse_b);
  const DeviceBuffer c_o_a = compact_copy(o_a), c_o_b = compact_copy(o_b),
                     c_lse_a = compact_copy(lse_a), c_lse_b = compact_copy(lse_b);
  DeviceBuffer c_out(o_a.bytes()), c_out_big_lse(lse_a.bytes()), c_out_lse(lse_a.bytes());
  const Device gpu = Device::cuda(0);
  const auto o = [&](void* p, std::int64_t ts) {
    return TensorView(p, DType::kBF16, {T, H, D}, {ts, D, 1}, gpu);
  };
  const auto l = [&](void* p, std::int64_t hs) {
    return TensorView(p, DType::kF32, {T, H}, {1, hs}, gpu);
  };
  const TensorView lse_a_view(c_lse_a.data(), DType::kF32, {T, H}, {1, T}, gpu);
  merge_attention_states(o(d_o_a.data(), o_stride), lse_a_view, o(d_o_b.data(), o_stride),
                         l(d_lse_b.data(), lse_b_stride), o(d_out.data(), o_stride),
                         l(c_out_big_lse.data(), T));
  merge_attention_states(o(c_o_a.data(), H * D), lse_a_view, o(c_o_b.data(), H * D),
                         l(c_lse_b.data(), T), o(c_out.data(), H * D), l(c_out_lse.data(), T));
  device_sync();
  EXPECT_TRUE(same_bytes(d_out.download().payload(), c_out.download(), "out"));
  EXPECT_TRUE(same_bytes(c_out_big_lse.download(), c_out_lse.download(), "out_lse"));
  EXPECT_TRUE(d_out.intact());
}

// The fused output quantization (group 128, f32 scales row-major) of prefill_attention's
// epilogue and of the merge, into an e4m3 out and a scale tensor whose row strides put their last
// rows past element 2^31. Bytes equal to the same calls into compact ones.
TEST(BigTensorCuda, FusedOutputQuantStridesPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  const std::int64_t T = kTokens, H = kHeads, W = H * 128;
  const std::int64_t out_stride = pitch_past_2_31(T), scale_stride = pitch_past_2_31(T);
  const HostBuffer q = attention_rows(T * H * 192, true, 41),
                   k = attention_rows(T * H * 192, true, 42),
                   v = attention_rows(T * H * 128, true, 43);  // transposed: [H][128][T]
  const DeviceBuffer c_q = compact_copy(q), c_k = compact_copy(k), c_v = compact_copy(v);
  const DeviceBuffer cu = to_device(std::vector<std::int32_t>{0, 30, 64});
  const DeviceBuffer descales = to_device(std::vector<float>{0.3f, 0.3f, 0.5f});
  DeviceBuffer states(std::size_t(T * W * 2)), lse(std::size_t(T * H * 4));
  DeviceBuffer c_out(std::size_t(T * W)), c_scales(std::size_t(T * H * 4));
  DeviceBuffer merged_lse(std::size_t(T * H * 4));
  PitchedRows d_out(T, std::size_t(W), std::size_t(out_stride)),
      d_scales(T, std::size_t(H * 4), std::size_t(scale_stride) * 4);
  const Device gpu = Device::cuda(0);
  const auto attention = [&](const TensorView& out, const TensorView& block_scale) {
    PrefillAttentionArgs a;
    a.q = TensorView(c_q.data(), DType::kE4M3, {T, H, 192}, gpu);
    a.k = TensorView(c_k.data(), DType::kE4M3, {T, H, 192}, gpu);
    a.v = TensorView(c_v.data(), DType::kE4M3, {T, H, 128}, {1, 128 * T, T}, gpu);
    a.cu_seqlens_q = a.cu_seqlens_k = TensorView(cu.data(), DType::kI32, {3}, gpu);
    a.max_seqlen_q = a.max_seqlen_k = 34;
    a.softmax_scale = float(1.0 / std::sqrt(192.0));
    a.q_descale = TensorView(descales.as<float>(), DType::kF32, {1}, gpu);
    a.k_descale = TensorView(descales.as<float>() + 1, DType::kF32, {1}, gpu);
    a.v_descale = TensorView(descales.as<float>() + 2, DType::kF32, {1}, gpu);
    a.out = out;
    a.output_block_scale = block_scale;
    return a;
  };
  const TensorView big_out(d_out.data(), DType::kE4M3, {T, W}, {out_stride, 1}, gpu),
      big_scales(d_scales.data(), DType::kF32, {T, H}, {scale_stride, 1}, gpu),
      compact_out(c_out.data(), DType::kE4M3, {T, W}, gpu),
      compact_scales(c_scales.data(), DType::kF32, {T, H}, gpu);
  const auto expect_same = [&](const char* what) {
    device_sync();
    EXPECT_TRUE(same_bytes(d_out.download().payload(), c_out.download(), what));
    EXPECT_TRUE(same_bytes(d_scales.download().payload(), c_scales.download(), what));
    EXPECT_TRUE(d_out.intact() && d_scales.intact());
  };
  prefill_attention(attention(big_out, big_scales));
  prefill_attention(attention(compact_out, compact_scales));
  expect_same("attention's epilogue");

  // The merge of the bf16 attention with itself, quantized the same way.
  PrefillAttentionArgs plain =
      attention(TensorView(states.data(), DType::kBF16, {T, H, 128}, gpu), {});
  plain.lse = TensorView(lse.data(), DType::kF32, {T, H}, gpu);
  prefill_attention(plain);
  d_out.poison();
  d_scales.poison();
  const auto merge = [&](const TensorView& out, const TensorView& block_scale) {
    merge_attention_states(plain.out, plain.lse, plain.out, plain.lse, out,
                           TensorView(merged_lse.data(), DType::kF32, {T, H}, gpu), {},
                           block_scale);
  };
  merge(big_out, big_scales);
  merge(compact_out, compact_scales);
  expect_same("merge");
}

// ---- Many tokens: offsets from cu_seqlens past element 2^31 ----------------------------------

// Random bytes from a hash of the 64-bit index: e4m3 codes of magnitude below 2^3 (no NaN), or
// bf16 values of magnitude 2^-9 to 2.
__global__ void fill_hashed(std::uint8_t* out, std::int64_t bytes, bool bf16, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < bytes;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = (std::uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 32;
    // e4m3 exponent field <= 9 (below 2^3); bf16 high bytes of exponents 118..128.
    out[i] = bf16 ? (i % 2 ? std::uint8_t((z & 0x80) | (0x3B + z % 5)) : std::uint8_t(z))
                  : std::uint8_t((z & 0x80) | (z >> 8) % 0x4F);
  }
}

DeviceBuffer hashed(std::size_t bytes, bool bf16, std::uint64_t seed) {
  DeviceBuffer d(bytes);
  fill_hashed<<<cuda::device_props(0).sm_count * 8, 256>>>(static_cast<std::uint8_t*>(d.data()),
                                                           std::int64_t(bytes), bf16, seed);
  cuda::check_launch("fill_hashed");
  return d;
}

void copy_d2d(void* dst, const void* src, std::size_t bytes) {
  cuda::check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
}

// 1368 sequences of 64 tokens and 128 heads: the q and k rows of the last two sequences start past
// element 2^31 (offsets from cu_seqlens times the token stride), their out rows past byte 2^31.
// The first, a middle and the last two sequences give the bytes of each run alone.
TEST(BigTensorCuda, PrefillAttentionManyTokensPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t H = 128, kLen = 64, kSeqs = 1368, T = kSeqs * kLen;
  static_assert(T * H * 192 > k2To31 + 2 * kLen * H * 192);
  const Device gpu = Device::cuda(0);
  const DeviceBuffer q = hashed(std::size_t(T * H * 192), false, 1),
                     k = hashed(std::size_t(T * H * 192), false, 2),
                     v = hashed(std::size_t(H * 128 * T), false, 3);  // [H][128][T]
  DeviceBuffer out(std::size_t(T * H * 128 * 2)), lse(std::size_t(T * H * 4));
  std::vector<std::int32_t> cu(kSeqs + 1);
  for (std::int64_t b = 0; b <= kSeqs; ++b) cu[std::size_t(b)] = std::int32_t(b * kLen);
  const DeviceBuffer cu_big = to_device(cu), cu_one = to_device(std::vector<std::int32_t>{0, kLen});
  const DeviceBuffer descales = to_device(std::vector<float>{0.3f, 0.3f, 0.5f});
  const auto args = [&](void* qq, void* kk, void* vv, std::int64_t tokens, void* o, void* l,
                        const DeviceBuffer& cu_view, std::int64_t batch) {
    PrefillAttentionArgs a;
    a.q = TensorView(qq, DType::kE4M3, {tokens, H, 192}, gpu);
    a.k = TensorView(kk, DType::kE4M3, {tokens, H, 192}, gpu);
    a.v = TensorView(vv, DType::kE4M3, {tokens, H, 128}, {1, 128 * tokens, tokens}, gpu);
    a.cu_seqlens_q = a.cu_seqlens_k = TensorView(cu_view.data(), DType::kI32, {batch + 1}, gpu);
    a.max_seqlen_q = a.max_seqlen_k = int(kLen);
    a.softmax_scale = float(1.0 / std::sqrt(192.0));
    a.q_descale = TensorView(descales.as<float>(), DType::kF32, {1}, gpu);
    a.k_descale = TensorView(descales.as<float>() + 1, DType::kF32, {1}, gpu);
    a.v_descale = TensorView(descales.as<float>() + 2, DType::kF32, {1}, gpu);
    a.out = TensorView(o, DType::kBF16, {tokens, H, 128}, gpu);
    a.lse = TensorView(l, DType::kF32, {tokens, H}, gpu);
    return a;
  };
  prefill_attention(args(q.data(), k.data(), v.data(), T, out.data(), lse.data(), cu_big, kSeqs));
  device_sync();
  DeviceBuffer q1(std::size_t(kLen * H * 192)), k1(std::size_t(kLen * H * 192)),
      v1(std::size_t(H * 128 * kLen)), out1(std::size_t(kLen * H * 128 * 2)),
      lse1(std::size_t(kLen * H * 4));
  for (std::int64_t b : {std::int64_t{0}, kSeqs / 2, kSeqs - 2, kSeqs - 1}) {
    SCOPED_TRACE(concat("sequence ", b, " of ", kSeqs));
    const std::size_t first = std::size_t(b * kLen);
    copy_d2d(q1.data(), q.as<std::uint8_t>() + first * H * 192, q1.bytes());
    copy_d2d(k1.data(), k.as<std::uint8_t>() + first * H * 192, k1.bytes());
    cuda::check(cudaMemcpy2D(v1.data(), kLen, v.as<std::uint8_t>() + first, std::size_t(T), kLen,
                             std::size_t(H * 128), cudaMemcpyDeviceToDevice),
                "cudaMemcpy2D");
    out1.fill(kPoison);
    lse1.fill(kPoison);
    prefill_attention(
        args(q1.data(), k1.data(), v1.data(), kLen, out1.data(), lse1.data(), cu_one, 1));
    device_sync();
    EXPECT_TRUE(
        same_bytes(out.download(first * H * 128 * 2, out1.bytes()), out1.download(), "out"));
    EXPECT_TRUE(same_bytes(lse.download(first * H * 4, lse1.bytes()), lse1.download(), "lse"));
  }
  EXPECT_TRUE(out.guards_intact() && lse.guards_intact());
}

// 131080 tokens of 128 heads of 128: the last 8 tokens' rows start past element 2^31. The last 16
// tokens (and the first 16) give the bytes of the merge of those tokens alone.
TEST(BigTensorCuda, MergeAttentionStatesManyTokensPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t H = 128, D = 128, T = (k2To31 / (H * D)) + 8, kRows = 16;
  const Device gpu = Device::cuda(0);
  const DeviceBuffer o_a = hashed(std::size_t(T * H * D * 2), true, 4),
                     o_b = hashed(std::size_t(T * H * D * 2), true, 5);
  std::vector<float> host_lse(std::size_t(T * H));
  Rng rng(6);
  for (float& x : host_lse) x = (rng.uniform() * 2 - 1) * 20;
  const DeviceBuffer lse_a = to_device(host_lse);
  for (float& x : host_lse) x = (rng.uniform() * 2 - 1) * 20;
  const DeviceBuffer lse_b = to_device(host_lse);
  DeviceBuffer out(std::size_t(T * H * D * 2)), out_lse(std::size_t(T * H * 4));
  const auto o = [&](const void* p, std::int64_t t) {
    return TensorView(const_cast<void*>(p), DType::kBF16, {t, H, D}, gpu);
  };
  const auto l = [&](const void* p, std::int64_t t) {
    return TensorView(const_cast<void*>(p), DType::kF32, {t, H}, gpu);
  };
  merge_attention_states(o(o_a.data(), T), l(lse_a.data(), T), o(o_b.data(), T), l(lse_b.data(), T),
                         o(out.data(), T), l(out_lse.data(), T));
  device_sync();
  const std::size_t row = std::size_t(H * D * 2), lse_row = std::size_t(H * 4);
  DeviceBuffer a1(kRows * row), b1(kRows * row), la1(kRows * lse_row), lb1(kRows * lse_row),
      out1(kRows * row), lse1(kRows * lse_row);
  for (std::int64_t first : {std::int64_t{0}, T - kRows}) {
    SCOPED_TRACE(concat("tokens ", first, " + ", kRows));
    const std::size_t f = std::size_t(first);
    copy_d2d(a1.data(), o_a.as<std::uint8_t>() + f * row, a1.bytes());
    copy_d2d(b1.data(), o_b.as<std::uint8_t>() + f * row, b1.bytes());
    copy_d2d(la1.data(), lse_a.as<std::uint8_t>() + f * lse_row, la1.bytes());
    copy_d2d(lb1.data(), lse_b.as<std::uint8_t>() + f * lse_row, lb1.bytes());
    merge_attention_states(o(a1.data(), kRows), l(la1.data(), kRows), o(b1.data(), kRows),
                           l(lb1.data(), kRows), o(out1.data(), kRows), l(lse1.data(), kRows));
    device_sync();
    EXPECT_TRUE(same_bytes(out.download(f * row, out1.bytes()), out1.download(), "out"));
    EXPECT_TRUE(same_bytes(out_lse.download(f * lse_row, lse1.bytes()), lse1.download(), "lse"));
  }
  EXPECT_TRUE(out.guards_intact() && out_lse.guards_intact());
}

}  // namespace
}  // namespace fp8mla::test
