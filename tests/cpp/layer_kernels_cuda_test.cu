// The CUDA layer's own small kernels (cuda/model/layer_kernels.hpp) called directly, against their
// CPU counterparts in model/cpu_math.hpp: RMSNorm within one bf16 step (the f32 sum's order
// differs), RoPE with the K assembly, the amax and the latent-row copies bit for bit, on padded
// rows whose padding must stay as it was, and at offsets past 2^31 (BigStridesPast2To31). They
// run here without the layer's cuBLASLt GEMMs, so that every sanitizer checks them (racecheck
// cannot run the GEMMs: docs/testing.md, Sanitizers).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/model/layer_kernels.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "model/cpu_math.hpp"

namespace fp8mla {
namespace {

using test::DeviceBuffer;
using test::to_device;

constexpr std::int64_t kNope = 128, kRope = kMlaRopeDim, kQk = 192;

// bf16 bits of N(0, scale) values.
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = encode_bf16(normal(rng));
  return v;
}

// The padding of a strided output (elements `width`..`stride` of each row) as it was poisoned.
void expect_padding_kept(const std::vector<std::uint16_t>& got, std::int64_t rows,
                         std::int64_t width, std::int64_t stride) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = width; i < stride; ++i) {
      ASSERT_EQ(got[std::size_t(r * stride + i)], 0xFFFFu) << "padding of row " << r << " written";
    }
  }
}

TEST(LayerKernelsCuda, RmsNormWithinOneBf16StepOfCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (const auto [rows, width] :
       {std::pair<std::int64_t, int>{1, 512}, {7, 1536}, {300, 7168}, {33, 8192}, {0, 512}}) {
    SCOPED_TRACE(testing::Message() << rows << " rows of " << width);
    const std::int64_t x_stride = width + 64, y_stride = width + 8;
    const auto x = random_bf16(std::size_t(std::max<std::int64_t>(rows * x_stride, 1)), rows, 3.0f);
    auto weight = random_bf16(std::size_t(width), width);
    const DeviceBuffer dx = to_device(x), dw = to_device(weight);
    DeviceBuffer dy(std::size_t(std::max<std::int64_t>(rows * y_stride, 1)) * 2);
    cuda::model::rms_norm({dx.as<std::uint16_t>(), x_stride, dw.as<std::uint16_t>(),
                           dy.as<std::uint16_t>(), y_stride, rows, width, 1e-6f},
                          nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint16_t> want(std::size_t(rows * width));
    model::rms_norm(x.data(), rows, width, x_stride,
                    TensorView(weight.data(), DType::kBF16, {width}), 1e-6, want.data());
    const auto got = dy.download_as<std::uint16_t>();
    std::int64_t differing = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t i = 0; i < width; ++i) {
        const int g = got[std::size_t(r * y_stride + i)], w = want[std::size_t(r * width + i)];
        ASSERT_LE(std::abs(g - w), 1) << "row " << r << " element " << i;
        differing += g != w;
      }
    }
    EXPECT_LE(differing, rows * width / 100);  // a 1-step difference is a rounding tie, rare
    expect_padding_kept(got, rows, width, y_stride);
    EXPECT_TRUE(dy.guards_intact());
  }
}

// K = [k_nope | rope(k_pe)] per head from a kv_b-shaped [T, H, 256] buffer and latent rows of 576,
// k_pe' into its own rows, q_pe RoPE'd in place in padded q rows; without positions no RoPE and
// q untouched.
TEST(LayerKernelsCuda, RopeAssemblyIsTheCpuRopeBitForBit) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kMaxPos = 97, kLatent = kMlaLatentDim;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> cos_sin(std::size_t(kMaxPos * kRope));
  for (float& c : cos_sin) c = unit(rng);
  const DeviceBuffer d_cos_sin = to_device(cos_sin);
  for (const auto [T, H] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {5, 16}, {77, 128}}) {
    for (const bool rope : {true, false}) {
      SCOPED_TRACE(testing::Message() << T << " tokens, " << H << " heads, rope " << rope);
      const std::int64_t q_token = H * kQk + 8;
      const auto kv = random_bf16(std::size_t(T * H * 256), T * 31 + H);
      const auto latent = random_bf16(std::size_t(T * kLatent), T * 37 + H);
      const auto q = random_bf16(std::size_t(T * q_token), T * 41 + H);
      std::vector<std::int64_t> positions(static_cast<std::size_t>(T));
      for (auto& p : positions) p = std::int64_t(rng() % kMaxPos);
      const DeviceBuffer d_kv = to_device(kv), d_latent = to_device(latent), d_q = to_device(q),
                         d_pos = to_device(positions);
      DeviceBuffer d_k(std::size_t(T * H * kQk) * 2), d_k_pe(std::size_t(T * kRope) * 2);
      cuda::model::RopeAssembleParams p;
      p.tokens = T;
      p.heads = H;
      p.k_nope = d_kv.as<std::uint16_t>();
      p.k_nope_token_stride = H * 256;
      p.k_nope_head_stride = 256;
      p.k_pe = d_latent.as<std::uint16_t>() + kMlaKvLoraRank;
      p.k_pe_stride = kLatent;
      p.k_out = d_k.as<std::uint16_t>();
      p.k_pe_out = d_k_pe.as<std::uint16_t>();
      p.q_pe = d_q.as<std::uint16_t>() + kNope;
      p.q_token_stride = q_token;
      p.q_head_stride = kQk;
      p.positions = rope ? d_pos.as<std::int64_t>() : nullptr;
      p.cos_sin = d_cos_sin.as<float>();
      cuda::model::rope_assemble_bf16(p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

      std::vector<std::uint16_t> k(std::size_t(T * H * kQk)), k_pe(std::size_t(T * kRope)),
          q_want = q;
      for (std::int64_t t = 0; t < T; ++t) {
        const float* cs = cos_sin.data() + positions[std::size_t(t)] * kRope;
        std::uint16_t* pe = k_pe.data() + t * kRope;
        std::memcpy(pe, latent.data() + t * kLatent + kMlaKvLoraRank, 2 * kRope);
        if (rope) model::rope_bf16(pe, cs);
        for (std::int64_t h = 0; h < H; ++h) {
          std::uint16_t* kr = k.data() + (t * H + h) * kQk;
          std::memcpy(kr, kv.data() + (t * H + h) * 256, 2 * kNope);
          std::memcpy(kr + kNope, pe, 2 * kRope);
          if (rope) model::rope_bf16(q_want.data() + t * q_token + h * kQk + kNope, cs);
        }
      }
      EXPECT_EQ(d_k.download_as<std::uint16_t>(), k);
      EXPECT_EQ(d_k_pe.download_as<std::uint16_t>(), k_pe);
      EXPECT_EQ(d_q.download_as<std::uint16_t>(), q_want);  // q's nope part and padding as given
      EXPECT_TRUE(d_k.guards_intact());
      EXPECT_TRUE(d_q.guards_intact());
    }
  }
}

// The amax bits of strided rows, added to what the cell held; a NaN wins, an infinity beats every
// number, no rows leave the cell as it was.
TEST(LayerKernelsCuda, AmaxIsTheCpuAmaxBitForBit) {
  FP8MLA_REQUIRE_HOPPER();
  struct Case {
    std::int64_t rows, cols;
    std::uint16_t planted;  // placed at the last element (0: none)
    unsigned held;          // the cell's value before
  };
  const Case cases[] = {{1, 64, 0, 0},         {300, 576, 0, 0},     {4099, 192, 0x7F80u, 0},
                        {17, 128, 0xFFC1u, 0}, {9, 512, 0, 0x7F00u}, {0, 512, 0, 0x1234u}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols << " planted " << c.planted);
    const std::int64_t stride = c.cols + 24;
    auto x = random_bf16(std::size_t(std::max<std::int64_t>(c.rows * stride, 1)), c.rows + c.cols);
    if (c.planted != 0) x[std::size_t((c.rows - 1) * stride + c.cols - 1)] = c.planted;
    const DeviceBuffer dx = to_device(x);
    const DeviceBuffer cell = to_device(std::vector<unsigned>{c.held});
    cuda::model::amax_bf16({dx.as<std::uint16_t>(), c.rows, c.cols, stride, cell.as<unsigned>()},
                           nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::uint16_t want = 0;
    for (std::int64_t r = 0; r < c.rows; ++r) {
      for (std::int64_t i = 0; i < c.cols; ++i)
        want = std::max(want, std::uint16_t(x[std::size_t(r * stride + i)] & 0x7FFFu));
    }
    const float cpu = model::amax_bf16(x.data(), c.rows, c.cols, stride);
    EXPECT_TRUE(std::isnan(cpu) ? (want & 0x7FFFu) > 0x7F80u : encode_bf16(cpu) == want);
    EXPECT_EQ(cell.download_as<unsigned>()[0], std::max<unsigned>(want, c.held));
  }
}

// Latent rows packed from a paged cache by slot (zeros for slot -1) and unpacked into another
// (nothing for slot -1, every other row as it was), through 16-byte words and, with an odd row
// stride, bytes.
TEST(LayerKernelsCuda, LatentRowsPackAndUnpackBySlot) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kPages = 7, kPageSize = 16, kRow = kMlaLatentDim;
  for (const std::int64_t row_stride : {kRow, kRow + 16, kRow + 1}) {
    SCOPED_TRACE(testing::Message() << "row stride " << row_stride);
    const std::int64_t page_stride = kPageSize * row_stride + 32;
    std::mt19937_64 rng(row_stride);
    std::vector<std::uint8_t> cache(std::size_t(kPages * page_stride));
    for (auto& b : cache) b = std::uint8_t(rng());
    std::vector<std::int64_t> slots;
    for (std::int64_t s = kPages * kPageSize - 1; s >= 0; s -= 3) slots.push_back(s);
    slots[3] = slots[10] = -1;
    const auto count = std::int64_t(slots.size());
    const DeviceBuffer d_cache = to_device(cache), d_slots = to_device(slots);
    DeviceBuffer d_rows(std::size_t(count * kRow));
    const auto at = [&](std::int64_t slot) {
      return std::size_t((slot / kPageSize) * page_stride + (slot % kPageSize) * row_stride);
    };
    cuda::model::copy_latent_rows(
        {d_cache.as<std::uint8_t>(), kPageSize, page_stride, row_stride, d_rows.as<std::uint8_t>(),
         d_slots.as<std::int64_t>(), count, false},
        nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint8_t> rows(std::size_t(count * kRow), 0);
    for (std::int64_t r = 0; r < count; ++r) {
      const std::int64_t s = slots[std::size_t(r)];
      if (s >= 0) std::memcpy(rows.data() + r * kRow, cache.data() + at(s), kRow);
    }
    EXPECT_EQ(d_rows.download(), rows);

    std::vector<std::uint8_t> other(cache.size());
    for (auto& b : other) b = std::uint8_t(rng());
    const DeviceBuffer d_other = to_device(other);
    cuda::model::copy_latent_rows(
        {d_other.as<std::uint8_t>(), kPageSize, page_stride, row_stride, d_rows.as<std::uint8_t>(),
         d_slots.as<std::int64_t>(), count, true},
        nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (std::int64_t r = 0; r < count; ++r) {
      const std::int64_t s = slots[std::size_t(r)];
      if (s >= 0) std::memcpy(other.data() + at(s), rows.data() + r * kRow, kRow);
    }
    EXPECT_EQ(d_other.download(), other);
    EXPECT_TRUE(d_other.guards_intact());
  }
}

// ---- Strides past 2^31 -------------------------------------------------------------------------

constexpr std::int64_t kPast2To31 = (std::int64_t(1) << 30) + 64;  // row 2 starts past 2^31

// Rows `rows` of `width` elements of T at `stride` elements apart in a poisoned device buffer:
// only the rows are copied in and out.
template <typename T>
struct StridedRows {
  std::int64_t rows, width, stride;
  DeviceBuffer buffer;
  StridedRows(std::int64_t r, std::int64_t w, std::int64_t s)
      : rows(r), width(w), stride(s), buffer(std::size_t((r - 1) * s + w) * sizeof(T)) {}
  T* data() const { return buffer.as<T>(); }
  void upload(const std::vector<T>& compact) {
    for (std::int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(cudaMemcpy(data() + r * stride, compact.data() + r * width,
                           std::size_t(width) * sizeof(T), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  std::vector<T> download() const {
    std::vector<T> compact(std::size_t(rows * width));
    for (std::int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(cudaMemcpy(compact.data() + r * width, data() + r * stride,
                           std::size_t(width) * sizeof(T), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return compact;
  }
};

// RMSNorm and the amax of three rows, RoPE with the K assembly of three tokens, and the latent
// rows of a cache page, each at offsets past element (or byte) 2^31: the results of the compact
// rows (64-bit addressing, or different bytes).
TEST(LayerKernelsCuda, BigStridesPast2To31) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kRows = 3, kWidth = 1536, H = 4;
  {
    const auto x = random_bf16(std::size_t(kRows * kWidth), 61, 2.0f);
    auto weight = random_bf16(std::size_t(kWidth), 62);
    const DeviceBuffer dw = to_device(weight);
    StridedRows<std::uint16_t> dx(kRows, kWidth, kPast2To31), dy(kRows, kWidth, kPast2To31);
    dx.upload(x);
    const DeviceBuffer cell = to_device(std::vector<unsigned>{0});
    cuda::model::rms_norm({dx.data(), kPast2To31, dw.as<std::uint16_t>(), dy.data(), kPast2To31,
                           kRows, int(kWidth), 1e-6f},
                          nullptr);
    cuda::model::amax_bf16({dx.data(), kRows, kWidth, kPast2To31, cell.as<unsigned>()}, nullptr);
    const DeviceBuffer c_x = to_device(x);
    DeviceBuffer c_y(std::size_t(kRows * kWidth) * 2);
    cuda::model::rms_norm({c_x.as<std::uint16_t>(), kWidth, dw.as<std::uint16_t>(),
                           c_y.as<std::uint16_t>(), kWidth, kRows, int(kWidth), 1e-6f},
                          nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dy.download(), c_y.download_as<std::uint16_t>()) << "rms_norm";
    EXPECT_EQ(cell.download_as<unsigned>()[0],
              encode_bf16(model::amax_bf16(x.data(), kRows, kWidth, kWidth)))
        << "amax";
    EXPECT_TRUE(dy.buffer.guards_intact());
  }
  {
    std::vector<float> cos_sin(std::size_t(8 * kRope));
    std::mt19937_64 rng(63);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (float& c : cos_sin) c = unit(rng);
    const DeviceBuffer d_cos_sin = to_device(cos_sin),
                       d_pos = to_device(std::vector<std::int64_t>{5, 0, 7});
    const auto kv = random_bf16(std::size_t(kRows * H * 256), 64),
               latent = random_bf16(std::size_t(kRows * kMlaLatentDim), 65),
               q = random_bf16(std::size_t(kRows * H * kQk), 66);
    StridedRows<std::uint16_t> b_kv(kRows, H * 256, kPast2To31),
        b_latent(kRows, kMlaLatentDim, kPast2To31), b_q(kRows, H * kQk, kPast2To31);
    b_kv.upload(kv);
    b_latent.upload(latent);
    b_q.upload(q);
    const DeviceBuffer c_kv = to_device(kv), c_latent = to_device(latent), c_q = to_device(q);
    DeviceBuffer b_k(std::size_t(kRows * H * kQk) * 2), c_k(std::size_t(kRows * H * kQk) * 2);
    const auto run = [&](const std::uint16_t* kv_p, const std::uint16_t* latent_p,
                         std::uint16_t* q_p, std::int64_t stride, std::uint16_t* k_out) {
      cuda::model::RopeAssembleParams p;
      p.tokens = kRows;
      p.heads = H;
      p.k_nope = kv_p;
      p.k_nope_token_stride = stride == 0 ? H * 256 : stride;
      p.k_nope_head_stride = 256;
      p.k_pe = latent_p + kMlaKvLoraRank;
      p.k_pe_stride = stride == 0 ? kMlaLatentDim : stride;
      p.k_out = k_out;
      p.q_pe = q_p + kNope;
      p.q_token_stride = stride == 0 ? H * kQk : stride;
      p.q_head_stride = kQk;
      p.positions = d_pos.as<std::int64_t>();
      p.cos_sin = d_cos_sin.as<float>();
      cuda::model::rope_assemble_bf16(p, nullptr);
    };
    run(b_kv.data(), b_latent.data(), b_q.data(), kPast2To31, b_k.as<std::uint16_t>());
    run(c_kv.as<std::uint16_t>(), c_latent.as<std::uint16_t>(), c_q.as<std::uint16_t>(), 0,
        c_k.as<std::uint16_t>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(b_k.download_as<std::uint16_t>(), c_k.download_as<std::uint16_t>()) << "k";
    EXPECT_EQ(b_q.download(), c_q.download_as<std::uint16_t>()) << "q_pe";
  }
  {
    // Two pages 2^31 + 16 bytes apart: slot 16 + 3 lies past byte 2^31.
    constexpr std::int64_t kPageSize = 16, kPageStride = (std::int64_t(1) << 31) + 16;
    const std::vector<std::int64_t> slots{19, 2, 31};
    std::vector<std::uint8_t> rows(slots.size() * kMlaLatentDim);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = std::uint8_t(i * 7 + 1);
    DeviceBuffer cache(std::size_t(kPageStride + kPageSize * kMlaLatentDim));
    const DeviceBuffer d_slots = to_device(slots), d_rows = to_device(rows);
    DeviceBuffer back(rows.size());
    const cuda::model::LatentRowsParams to_cache{cache.as<std::uint8_t>(),
                                                 kPageSize,
                                                 kPageStride,
                                                 kMlaLatentDim,
                                                 d_rows.as<std::uint8_t>(),
                                                 d_slots.as<std::int64_t>(),
                                                 std::int64_t(slots.size()),
                                                 true};
    cuda::model::copy_latent_rows(to_cache, nullptr);
    cuda::model::LatentRowsParams from_cache = to_cache;
    from_cache.rows = back.as<std::uint8_t>();
    from_cache.to_cache = false;
    cuda::model::copy_latent_rows(from_cache, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(back.download(), rows) << "latent rows";
    EXPECT_EQ(cache.download(std::size_t(kPageStride + 3 * kMlaLatentDim), kMlaLatentDim),
              std::vector<std::uint8_t>(rows.begin(), rows.begin() + kMlaLatentDim))
        << "slot 19 at its byte offset";
    EXPECT_TRUE(cache.guards_intact());
  }
}

}  // namespace
}  // namespace fp8mla
