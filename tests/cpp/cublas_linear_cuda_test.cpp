// CublasLinear (cuBLASLt projections) against a float64 host reference on the shapes of
// DeepSeek-V3's MLA projections, bf16 and fp8 block; plans reused across row counts; the errors
// of bad arguments. Every output element is checked, and y is poisoned with NaN beforehand.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda/model/cublas_linear.hpp"
#include "cuda_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::cuda::model {
namespace {

constexpr std::int64_t kGroup = 128;
constexpr std::uint16_t kNanBf16 = 0x7FC0;

using test::DeviceBuffer;

class Stream {
 public:
  Stream() { check(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

// xorshift64*: the largest weights have 117M elements, too many for std::mt19937 to be quick.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint32_t below(std::uint32_t n) {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return std::uint32_t(((state_ * 0x2545F4914F6CDD1Dull) >> 32) % n);
  }

 private:
  std::uint64_t state_;
};

// Runs fn(i) for i in [0, n) on every hardware thread.
template <typename Fn>
void parallel_for(std::int64_t n, Fn fn) {
  const unsigned count = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<std::int64_t> next{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < count; ++t) {
    threads.emplace_back([&] {
      for (std::int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// A projection's weight on the host (as stored and decoded) and on the device.
struct Weight {
  LinearFormat format;
  std::int64_t out, in;
  std::vector<std::uint16_t> bf16;   // [out, in], bf16 format
  std::vector<std::uint8_t> e4m3;    // [out, in], fp8 format
  std::vector<float> values;         // [out, in], decoded, before the block scales
  std::vector<float> scale_inv;      // fp8: [ceil(out/128), in/128] row-major
  std::vector<DeviceBuffer> device;  // weight, then scale_inv

  LinearWeight view() const {
    LinearWeight w;
    w.format = format;
    w.weight = device[0].data();
    w.scale_inv = format == LinearFormat::kFp8Block ? device[1].as<const float>() : nullptr;
    w.out = out;
    w.in = in;
    return w;
  }
};

// An activation x [rows, in] on the host and device (fp8: with scales [in/128][rows]).
struct Input {
  std::int64_t rows;
  std::vector<float> values;         // decoded, before the scales
  std::vector<float> scales;         // fp8: x_scales[g * rows + r]
  std::vector<DeviceBuffer> device;  // x, then x_scales

  const float* device_scales() const {
    return device.size() > 1 ? device[1].as<const float>() : nullptr;
  }
};

// Values the GPU sums exactly (see check_output): multiples of 1/8 in [-1, 1] for bf16,
// {0, +-0.5, +-1, +-1.5} for e4m3.
float pick_bf16(Rng& rng) {
  return float(int(rng.below(17)) - 8) / 8.0f;
}
float pick_e4m3(Rng& rng) {
  static constexpr float kValues[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 1.5f, -1.5f};
  return kValues[rng.below(7)];
}
// Block scales 2^e (1 + m/8), e in [-3, 3]: distinct enough that a misplaced one shows.
float pick_scale(Rng& rng) {
  return std::ldexp(1.0f + float(rng.below(8)) / 8.0f, int(rng.below(7)) - 3);
}

Weight make_weight(LinearFormat format, std::int64_t out, std::int64_t in, std::uint64_t seed) {
  Weight w{format, out, in, {}, {}, {}, {}, {}};
  const auto count = std::size_t(out * in);
  w.values.resize(count);
  Rng rng(seed);
  if (format == LinearFormat::kBf16) {
    w.bf16.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      w.bf16[i] = encode_bf16(pick_bf16(rng));
      w.values[i] = decode_bf16(w.bf16[i]);
    }
    w.device.push_back(test::to_device(w.bf16));
  } else {
    w.e4m3.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      w.e4m3[i] = encode_e4m3(pick_e4m3(rng));
      w.values[i] = decode_e4m3(w.e4m3[i]);
    }
    const std::int64_t blocks = (out + kGroup - 1) / kGroup, groups = in / kGroup;
    w.scale_inv.resize(std::size_t(blocks * groups));
    for (float& s : w.scale_inv) s = pick_scale(rng);
    // On the device each row padded to linear_scale_columns(in) with NaN: a padding read shows.
    const std::int64_t padded = linear_scale_columns(in);
    std::vector<float> device_scales(std::size_t(blocks * padded), std::nanf(""));
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::copy_n(&w.scale_inv[std::size_t(b * groups)], groups,
                  &device_scales[std::size_t(b * padded)]);
    }
    w.device.push_back(test::to_device(w.e4m3));
    w.device.push_back(test::to_device(device_scales));
  }
  return w;
}

Input make_input(LinearFormat format, std::int64_t rows, std::int64_t in, std::uint64_t seed) {
  Input x{rows, {}, {}, {}};
  const auto count = std::size_t(rows * in);
  x.values.resize(count);
  Rng rng(seed);
  if (format == LinearFormat::kBf16) {
    std::vector<std::uint16_t> bits(count);
    for (std::size_t i = 0; i < count; ++i) {
      bits[i] = encode_bf16(pick_bf16(rng));
      x.values[i] = decode_bf16(bits[i]);
    }
    x.device.push_back(test::to_device(bits));
  } else {
    std::vector<std::uint8_t> bytes(count);
    for (std::size_t i = 0; i < count; ++i) {
      bytes[i] = encode_e4m3(pick_e4m3(rng));
      x.values[i] = decode_e4m3(bytes[i]);
    }
    x.scales.resize(std::size_t(in / kGroup * rows));
    for (float& s : x.scales) s = pick_scale(rng);
    x.device.push_back(test::to_device(bytes));
    x.device.push_back(test::to_device(x.scales));
  }
  return x;
}

struct Reference {
  std::vector<double> y;      // [rows, out]
  std::vector<double> bound;  // [rows, out]: allowed |y_gpu - y|
};

// float64 reference of y = x . W^T on the dequantized values, with each element's error bound.
//  - bf16: products of multiples of 1/8 are multiples of 2^-6, and a partial sum of up to 16384
//    of them (|sum| <= 2^14) has at most 21 significant bits, so f32 accumulation is exact in any
//    order or split: y must be the reference rounded once to bf16, within 2^-8 |ref|; checked
//    with 2^-7 |ref| (any faithful rounding) + 2^-20 sum |x_k w_k| as a margin.
//  - fp8: each 128-element block sum of products of {0, +-0.5, +-1, +-1.5} is a multiple of 1/4
//    below 2^9, exact even in the ~14-bit accumulator of Hopper's fp8 MMA (DeepSeek-V3 report
//    3.3.2); what remains is f32 scaling and summing of in/128 = L block results, at most
//    (2L + 8) roundings of 2^-23 (truncating) relative to sum_g |sx sw S_g|, then bf16 (2^-7).
Reference reference(const Weight& w, const Input& x) {
  const std::int64_t rows = x.rows, out = w.out, in = w.in, groups = in / kGroup;
  const bool fp8 = w.format == LinearFormat::kFp8Block;
  Reference ref;
  ref.y.resize(std::size_t(rows * out));
  ref.bound.resize(ref.y.size());
  parallel_for(out, [&](std::int64_t o) {
    const float* wrow = w.values.data() + o * in;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xrow = x.values.data() + r * in;
      double sum = 0, magnitude = 0;
      for (std::int64_t g = 0; g < groups; ++g) {
        double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};
        for (std::int64_t k = g * kGroup; k < (g + 1) * kGroup; k += 4) {
          for (int j = 0; j < 4; ++j) {
            const double p = double(xrow[k + j]) * double(wrow[k + j]);
            s[j] += p;
            a[j] += std::abs(p);
          }
        }
        const double block = (s[0] + s[1]) + (s[2] + s[3]);
        if (fp8) {
          const double scale = double(x.scales[std::size_t(g * rows + r)]) *
                               double(w.scale_inv[std::size_t((o / kGroup) * groups + g)]);
          sum += scale * block;
          magnitude += std::abs(scale * block);
        } else {
          sum += block;
          magnitude += (a[0] + a[1]) + (a[2] + a[3]);
        }
      }
      const double accumulation =
          fp8 ? double(2 * groups + 8) * std::ldexp(1.0, -23) : std::ldexp(1.0, -20);
      ref.y[std::size_t(r * out + o)] = sum;
      ref.bound[std::size_t(r * out + o)] =
          std::ldexp(std::abs(sum), -7) + accumulation * magnitude;
    }
  });
  return ref;
}

struct Checked {
  double max_error = 0;  // max |y - ref|
  double max_ratio = 0;  // max |y - ref| / bound
  double max_rel = 0;    // max |y - ref| / |ref| over ref != 0
};

// Every element written (no NaN poison left) and within its bound.
Checked check_output(const std::vector<std::uint16_t>& y, std::int64_t out, const Reference& ref,
                     const std::string& what) {
  Checked c;
  std::int64_t unwritten = 0, wrong = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double value = decode_bf16(y[i]);
    if (std::isnan(value)) {
      ++unwritten;
      continue;
    }
    const double error = std::abs(value - ref.y[i]);
    c.max_error = std::max(c.max_error, error);
    c.max_ratio = std::max(c.max_ratio, error / ref.bound[i]);
    if (ref.y[i] != 0) c.max_rel = std::max(c.max_rel, error / std::abs(ref.y[i]));
    if (!(error <= ref.bound[i]) && ++wrong <= 3) {
      ADD_FAILURE() << what << ": y[" << std::int64_t(i) / out << ", " << std::int64_t(i) % out
                    << "] is " << value << ", expected " << ref.y[i] << " +- " << ref.bound[i];
    }
  }
  EXPECT_EQ(unwritten, 0) << what << ": elements left unwritten (still NaN)";
  EXPECT_EQ(wrong, 0) << what << ": elements outside their bound";
  return c;
}

std::vector<std::uint16_t> run_linear(CublasLinear& linear, const Input& x, const Stream& stream,
                                      const DeviceBuffer& workspace) {
  const std::vector<std::uint16_t> poison(std::size_t(x.rows * linear.weight().out), kNanBf16);
  DeviceBuffer y = test::to_device(poison);
  linear.run(x.device[0].data(), x.device_scales(), x.rows, y.data(), workspace.data(),
             kLinearWorkspaceBytes, stream.get());
  stream.sync();
  return y.download_as<std::uint16_t>();
}

struct Shape {
  std::int64_t out, in;
  std::vector<std::int64_t> rows;
};

// V3's projections: q_a, kv_a (576 = 512 + 64, not a multiple of 128), q_b, kv_b, o; then inputs
// of 3 and 5 groups of 128 (o_proj at 3 heads a rank; the scales' rows padded to 4 and 8).
const std::vector<Shape> kShapes = {
    {1536, 7168, {1, 7, 300}}, {576, 7168, {1, 7, 300}}, {24576, 1536, {1, 7, 300}},
    {32768, 512, {64}},        {7168, 16384, {64}},      {256, 384, {1, 7, 300}},
    {136, 640, {4, 13}},
};

void expect_matches_reference(LinearFormat format) {
  const char* name = format == LinearFormat::kFp8Block ? "fp8 block" : "bf16";
  const CublasLtHandle handle;
  const Stream stream;
  const DeviceBuffer workspace(kLinearWorkspaceBytes);
  Checked worst;
  std::uint64_t seed = 1;
  for (const Shape& shape : kShapes) {
    const Weight w = make_weight(format, shape.out, shape.in, seed);
    seed += 10;
    // One failing case (an Error from cuBLASLt included) does not hide the others.
    try {
      CublasLinear linear(handle.get(), w.view(), 300);
      for (const std::int64_t rows : shape.rows) {
        const std::string what = concat(name, " out ", shape.out, " in ", shape.in, " rows ", rows);
        try {
          const Input x = make_input(format, rows, shape.in, seed++);
          const Checked c = check_output(run_linear(linear, x, stream, workspace), shape.out,
                                         reference(w, x), what);
          std::printf("%s: max |y-ref| %.3g, max |y-ref|/|ref| %.3g, max |y-ref|/bound %.3g\n",
                      what.c_str(), c.max_error, c.max_rel, c.max_ratio);
          std::fflush(stdout);
          worst.max_ratio = std::max(worst.max_ratio, c.max_ratio);
        } catch (const Error& e) {
          ADD_FAILURE() << what << ": " << e.what();
        }
      }
    } catch (const Error& e) {
      ADD_FAILURE() << name << " out " << shape.out << " in " << shape.in << ": " << e.what();
    }
  }
  std::printf("%s: worst |y-ref|/bound over all cases %.3g\n", name, worst.max_ratio);
  std::fflush(stdout);
}

TEST(CublasLinearCuda, Bf16MatchesFloat64Reference) {
  FP8MLA_REQUIRE_HOPPER();
  std::printf("cuBLASLt %zu on %s\n", cublasLtGetVersion(), current_device_props().name.c_str());
  expect_matches_reference(LinearFormat::kBf16);
}

TEST(CublasLinearCuda, Fp8BlockMatchesFloat64Reference) {
  FP8MLA_REQUIRE_HOPPER();
  expect_matches_reference(LinearFormat::kFp8Block);
}

// One plan run at changing row counts (new heuristic queries, cached ones, fp8's padded 4-row
// tail) gives bit for bit what a fresh plan gives.
TEST(CublasLinearCuda, ChangingRowCountsMatchFreshPlans) {
  FP8MLA_REQUIRE_HOPPER();
  const CublasLtHandle handle;
  const Stream stream;
  const DeviceBuffer workspace(kLinearWorkspaceBytes);
  constexpr std::int64_t kMaxRows = 301;
  for (const LinearFormat format : {LinearFormat::kBf16, LinearFormat::kFp8Block}) {
    const char* name = format == LinearFormat::kFp8Block ? "fp8 block" : "bf16";
    try {
      const Weight w = make_weight(format, 1536, 7168, 100);
      CublasLinear reused(handle.get(), w.view(), kMaxRows);
      std::uint64_t seed = 200;
      for (const std::int64_t rows : {300, 7, 300, 301}) {
        const std::string what = concat(name, " rows ", rows);
        const Input x = make_input(format, rows, w.in, seed++);
        const std::vector<std::uint16_t> y = run_linear(reused, x, stream, workspace);
        CublasLinear fresh(handle.get(), w.view(), kMaxRows);
        const std::vector<std::uint16_t> expected = run_linear(fresh, x, stream, workspace);
        std::int64_t differ = 0, first = -1;
        for (std::size_t i = 0; i < y.size(); ++i) {
          if (y[i] != expected[i] && differ++ == 0) first = std::int64_t(i);
        }
        EXPECT_EQ(differ, 0) << what << ": elements that differ from a fresh plan's, first at "
                             << first;
        const Checked c = check_output(y, w.out, reference(w, x), what);
        std::printf(
            "%s, reused plan: max |y-ref|/bound %.3g, %ld elements differ from a fresh "
            "plan's\n",
            what.c_str(), c.max_ratio, long(differ));
        std::fflush(stdout);
      }
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
}

TEST(CublasLinearCuda, ErrorsNameWhatWasExpected) {
  FP8MLA_REQUIRE_HOPPER();
  using test::expect_error;
  const CublasLtHandle handle;
  const Stream stream;
  const DeviceBuffer workspace(kLinearWorkspaceBytes);
  const Weight bf16 = make_weight(LinearFormat::kBf16, 64, 512, 1);
  const Weight fp8 = make_weight(LinearFormat::kFp8Block, 64, 512, 2);
  const Input xb = make_input(LinearFormat::kBf16, 16, 512, 3);
  const Input xf = make_input(LinearFormat::kFp8Block, 16, 512, 4);
  const DeviceBuffer y(std::size_t(17 * 64 * 2));
  CublasLinear lb(handle.get(), bf16.view(), 16);
  CublasLinear lf(handle.get(), fp8.view(), 16);
  const auto run = [&](CublasLinear& l, const void* x, const float* scales, std::int64_t rows,
                       void* out, std::size_t workspace_bytes = kLinearWorkspaceBytes) {
    l.run(x, scales, rows, out, workspace.data(), workspace_bytes, stream.get());
  };

  expect_error([&] { run(lb, xb.device[0].data(), nullptr, 17, y.data()); },
               ErrorCategory::kInvalidArgument, {"0 <= rows <= max_rows 16", "got rows 17"});
  expect_error([&] { run(lf, xf.device[0].data(), xf.device_scales(), -1, y.data()); },
               ErrorCategory::kInvalidArgument, {"0 <= rows <= max_rows 16", "got rows -1"});
  expect_error([&] { run(lb, nullptr, nullptr, 4, y.data()); }, ErrorCategory::kInvalidArgument,
               {"-byte aligned device pointer for x (bf16 [rows, in])", "got"});
  expect_error([&] { run(lb, xb.device[0].data(), nullptr, 4, nullptr); },
               ErrorCategory::kInvalidArgument, {"pointer for y (bf16 [rows, out])", "got"});
  expect_error([&] { run(lf, xf.device[0].data(), nullptr, 4, y.data()); },
               ErrorCategory::kInvalidArgument, {"pointer for x_scales (f32 [in/128][rows])"});
  // fp8 with rows % 4 != 0 needs scratch space in the workspace.
  expect_error([&] { run(lf, xf.device[0].data(), xf.device_scales(), 7, y.data(), 0); },
               ErrorCategory::kInvalidArgument,
               {"with 7 rows expected a workspace of at least", "got 0 bytes"});
  // rows == 0 does nothing, whatever the pointers.
  run(lf, nullptr, nullptr, 0, nullptr);

  LinearWeight bad = fp8.view();
  bad.in = 320;  // not whole groups of 128
  expect_error([&] { CublasLinear(handle.get(), bad, 16); }, ErrorCategory::kUnsupported,
               {"fp8 block projection [out 64, in 320]", "needs in % 128 == 0", "out % 8 == 0",
                "got in % 128 = 64, out % 8 = 0"});
  bad = fp8.view();
  bad.out = 1540;
  expect_error([&] { CublasLinear(handle.get(), bad, 16); }, ErrorCategory::kUnsupported,
               {"[out 1540, in 512]", "needs in % 128 == 0", "got in % 128 = 0, out % 8 = 4"});
  bad = fp8.view();
  bad.scale_inv = nullptr;
  expect_error([&] { CublasLinear(handle.get(), bad, 16); }, ErrorCategory::kInvalidArgument,
               {"pointer for scale_inv (f32 [ceil(out/128), linear_scale_columns(in)])", "got"});
  bad = bf16.view();
  bad.weight = nullptr;
  expect_error([&] { CublasLinear(handle.get(), bad, 16); }, ErrorCategory::kInvalidArgument,
               {"bf16 projection [out 64, in 512]", "pointer for the weight"});
  expect_error([&] { CublasLinear(handle.get(), bf16.view(), 0); }, ErrorCategory::kInvalidArgument,
               {"max_rows > 0", "max_rows 0"});
}

}  // namespace
}  // namespace fp8mla::cuda::model
