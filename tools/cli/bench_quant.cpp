// `fp8mla bench quant`: times the quantization ops (DESIGN section 3, ops 1-3) on CUDA device 0
// through the public C++ API and the default stream, next to a device-to-device copy of the same
// byte count measured the same way.
//
// Method (see bench/README.md): CUDA events around each launch, `--warmup` untimed launches, then
// `--iters` timed ones, median. Every launch uses the next of a ring of buffer sets whose total
// exceeds 2x the L2 (one set when a set alone is that large), so no launch finds its data in the
// L2. Inputs are random non-zero bf16. Bytes = input read + output written + scales read/written,
// counted exactly once each (the fewest any implementation must move). After timing, the first
// rows of one set are compared bit for bit with the CPU implementation.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/runtime_info.hpp"
#include "gpu_timer.hpp"

namespace fp8mla::cli {
namespace {

// Token counts of the DeepSeek prefill shapes: 1 to 128k, powers of 4 (and 128k).
constexpr std::int64_t kTokens[] = {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 131072};
constexpr std::int64_t kMillionRows = std::int64_t(1) << 20;
constexpr int kHeads = 128;
constexpr float kScaleInv = 16.0f;           // inputs have |x| < 16: |x * 16| < 256 < 448
constexpr float kNvfp4GlobalScale = 168.0f;  // 448 * 6 / 16
constexpr std::int64_t kCheckRows = 128;     // rows compared with the CPU implementation

enum class Op { kStatic, kDynamic, kGroupF32, kGroupUe8m0, kNvfp4 };

struct OpInfo {
  Op op;
  const char* name;
  const char* what;
};

constexpr OpInfo kOps[] = {
    {Op::kStatic, "per_tensor_static", "per-tensor FP8 e4m3 from bf16, static scale"},
    {Op::kDynamic, "per_tensor_dynamic", "per-tensor FP8 e4m3 from bf16, dynamic scale (amax)"},
    {Op::kGroupF32, "group128_f32", "per-token-group 128 FP8 e4m3, f32 row-major scales"},
    {Op::kGroupUe8m0, "group128_packed_ue8m0",
     "per-token-group 128 FP8 e4m3, packed UE8M0 scales (TMA-aligned column-major int32)"},
    {Op::kNvfp4, "nvfp4_swizzled", "NVFP4 e2m1 with e4m3 block scales, 128x4 swizzled"},
};

bool per_tensor(Op op) {
  return op == Op::kStatic || op == Op::kDynamic;
}
bool group(Op op) {
  return op == Op::kGroupF32 || op == Op::kGroupUe8m0;
}

struct Shape {
  std::string label;  // what the rows are: "kv_c T=4096", "per_head T=16 ([T*128, 128])"
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

std::string shape_text(const Shape& s) {
  return concat(s.rows, "x", s.cols);
}

// The shapes of a preset for one op. Presets: default (T = 1..128k), quick (T = 1, 4k, 128k),
// large (T = 64k, 128k); per-tensor ops also get 1M x 512 and 1M x 384 in every preset.
std::vector<Shape> preset_shapes(Op op, std::string_view preset) {
  std::vector<std::int64_t> tokens;
  if (preset == "default") {
    tokens.assign(std::begin(kTokens), std::end(kTokens));
  } else if (preset == "quick") {
    tokens = {1, 4096, 131072};
  } else if (preset == "large") {
    tokens = {65536, 131072};
  } else {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("--shapes: expected a preset (default, quick, large) or a list of RxC "
                       "shapes such as 1048576x512,4096x7168, got '",
                       preset, "'"));
  }
  std::vector<Shape> shapes;
  for (std::int64_t t : tokens) {
    if (per_tensor(op)) {
      shapes.push_back({concat("kv_c T=", t), t, 512});
      shapes.push_back({concat("kv_c+k_pe T=", t), t, 576});
      shapes.push_back({concat("per_head T=", t, " [T*128,128]"), t * kHeads, 128});
    } else {
      shapes.push_back({concat("hidden T=", t), t, 7168});
      shapes.push_back({concat("attn_out T=", t), t, 16384});
    }
  }
  if (per_tensor(op)) {
    shapes.push_back({"1M rows x 512", kMillionRows, 512});
    shapes.push_back({"1M rows x 384", kMillionRows, 384});
  }
  return shapes;
}

std::int64_t parse_int(std::string_view text, std::string_view item) {
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value <= 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("--shapes: expected RxC with positive integers, got '", item, "'"));
  }
  return value;
}

// "default" / "quick" / "large", or a comma list "RxC,RxC" (rows x cols, applied to every op).
std::vector<Shape> shapes_for(Op op, const std::string& spec) {
  if (spec.find('x') == std::string::npos) return preset_shapes(op, spec);
  std::vector<Shape> shapes;
  std::string_view rest = spec;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t x = item.find('x');
    if (x == std::string_view::npos) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("--shapes: expected RxC (e.g. 4096x512), got '", item, "'"));
    }
    const Shape s{"custom", parse_int(item.substr(0, x), item),
                  parse_int(item.substr(x + 1), item)};
    shapes.push_back({concat("custom ", shape_text(s)), s.rows, s.cols});
  }
  return shapes;
}

// Why `op` cannot run on `shape`, or empty.
std::string unsupported_reason(Op op, const Shape& s) {
  if (group(op) && s.cols % 128 != 0) return "cols not a multiple of the group size 128";
  if (op == Op::kNvfp4 && s.cols % 16 != 0) return "cols not a multiple of 16";
  return {};
}

// ---- Buffers and byte counts of one (op, shape) ------------------------------------------------

std::int64_t groups_of(const Shape& s) {
  return s.cols / 128;
}
std::int64_t packed_words_of(const Shape& s) {
  return (groups_of(s) + 3) / 4;
}
std::int64_t nvfp4_scale_cols(const Shape& s) {
  return round_up(s.cols / 16, 4);
}

struct ByteCount {
  std::int64_t in = 0;      // input read
  std::int64_t out = 0;     // quantized output written
  std::int64_t scales = 0;  // scales written (and the NVFP4 global scale read)
  std::int64_t total() const { return in + out + scales; }
};

// Role 0 is the input; the others are outputs. Sizes are the allocations.
std::vector<std::int64_t> role_bytes(Op op, const Shape& s) {
  const std::int64_t n = s.rows * s.cols;
  switch (op) {
    case Op::kStatic:
      return {2 * n, n};
    case Op::kDynamic:
      return {2 * n, n, 4};
    case Op::kGroupF32:
      return {2 * n, n, s.rows * groups_of(s) * 4};
    case Op::kGroupUe8m0:
      return {2 * n, n, round_up(s.rows, 4) * packed_words_of(s) * 4};
    case Op::kNvfp4:
      return {2 * n, n / 2, round_up(s.rows, 128) * nvfp4_scale_cols(s)};
  }
  return {};
}

ByteCount count_bytes(Op op, const Shape& s) {
  const std::int64_t n = s.rows * s.cols;
  switch (op) {
    case Op::kStatic:
      return {2 * n, n, 0};
    case Op::kDynamic:
      return {2 * n, n, 4};
    case Op::kGroupF32:
      return {2 * n, n, s.rows * groups_of(s) * 4};
    case Op::kGroupUe8m0:  // the kernel writes the words of the M rows, not the TMA row padding
      return {2 * n, n, s.rows * packed_words_of(s) * 4};
    case Op::kNvfp4:  // block scales with their padding (written as zero) + the global scale
      return {2 * n, n / 2, round_up(s.rows, 128) * nvfp4_scale_cols(s) + 4};
  }
  return {};
}

// The call on one buffer set (data pointers per role, as role_bytes() orders them).
void run_op(Op op, const Shape& s, std::byte* const* p, const float* global_scale, Device device) {
  const std::int64_t m = s.rows;
  const std::int64_t k = s.cols;
  const TensorView input(p[0], DType::kBF16, {m, k}, device);
  switch (op) {
    case Op::kStatic:
      quantize_fp8(input, TensorView(p[1], DType::kE4M3, {m, k}, device), kScaleInv);
      return;
    case Op::kDynamic:
      quantize_fp8_dynamic(input, TensorView(p[1], DType::kE4M3, {m, k}, device),
                           TensorView(p[2], DType::kF32, {1}, device));
      return;
    case Op::kGroupF32:
      quantize_fp8_per_token_group(input, TensorView(p[1], DType::kE4M3, {m, k}, device),
                                   TensorView(p[2], DType::kF32, {m, groups_of(s)}, device));
      return;
    case Op::kGroupUe8m0: {
      // TMA-aligned column-major words: strides (1, round_up(rows, 4)).
      quantize_fp8_per_token_group(
          input, TensorView(p[1], DType::kE4M3, {m, k}, device),
          TensorView(p[2], DType::kI32, {m, packed_words_of(s)}, {1, round_up(m, 4)}, device));
      return;
    }
    case Op::kNvfp4:
      quantize_nvfp4(
          input, TensorView(p[1], DType::kE2M1x2, {m, k / 2}, device),
          TensorView(p[2], DType::kE4M3, {round_up(m, 128), nvfp4_scale_cols(s)}, device),
          TensorView(const_cast<float*>(global_scale), DType::kF32, {1}, device),
          Nvfp4ScaleLayout::kSwizzled128x4);
      return;
  }
}

// ---- Check: the first rows of set 0 against the CPU implementation -----------------------------

std::string check_against_cpu(Op op, const Shape& s, const RotatingSets& sets) {
  const std::int64_t r = std::min(s.rows, kCheckRows);
  const std::int64_t k = s.cols;
  const Device cpu = Device::cpu();
  std::vector<std::uint16_t> x = to_host<std::uint16_t>(sets.at(0, 0), r * k);
  const TensorView input(x.data(), DType::kBF16, {r, k}, cpu);
  const std::vector<std::uint8_t> gpu_out =
      to_host<std::uint8_t>(sets.at(1, 0), op == Op::kNvfp4 ? r * k / 2 : r * k);
  std::vector<std::uint8_t> cpu_out(gpu_out.size());
  std::int64_t out_diff = 0, scale_diff = 0, scale_count = 0;
  switch (op) {
    case Op::kStatic:
      quantize_fp8(input, TensorView(cpu_out.data(), DType::kE4M3, {r, k}, cpu), kScaleInv);
      break;
    case Op::kDynamic: {
      // The GPU's scale comes from the whole tensor; the CPU quantizes the rows with it.
      const float scale = to_host<float>(sets.at(2, 0), 1)[0];
      quantize_fp8(input, TensorView(cpu_out.data(), DType::kE4M3, {r, k}, cpu), 1.0f / scale);
      break;
    }
    case Op::kGroupF32: {
      const std::int64_t g = groups_of(s);
      std::vector<float> cpu_scales(static_cast<std::size_t>(r * g));
      quantize_fp8_per_token_group(input, TensorView(cpu_out.data(), DType::kE4M3, {r, k}, cpu),
                                   TensorView(cpu_scales.data(), DType::kF32, {r, g}, cpu));
      const std::vector<float> gpu_scales = to_host<float>(sets.at(2, 0), r * g);
      scale_diff = count_diff(cpu_scales, gpu_scales);
      scale_count = r * g;
      break;
    }
    case Op::kGroupUe8m0: {
      // GPU words are column-major with leading dimension round_up(rows, 4): fetch r per column.
      const std::int64_t w = packed_words_of(s), ld = round_up(s.rows, 4);
      std::vector<std::int32_t> cpu_cm(static_cast<std::size_t>(r * w));
      quantize_fp8_per_token_group(input, TensorView(cpu_out.data(), DType::kE4M3, {r, k}, cpu),
                                   TensorView(cpu_cm.data(), DType::kI32, {r, w}, {1, r}, cpu));
      std::vector<std::int32_t> gpu_cm(static_cast<std::size_t>(r * w));
      cuda::check(
          cudaMemcpy2D(gpu_cm.data(), std::size_t(r) * 4, sets.at(2, 0), std::size_t(ld) * 4,
                       std::size_t(r) * 4, std::size_t(w), cudaMemcpyDeviceToHost),
          "cudaMemcpy2D(check)");
      scale_diff = count_diff(cpu_cm, gpu_cm);
      scale_count = r * w;
      break;
    }
    case Op::kNvfp4: {
      // The first 128-row tile of the swizzled scales holds exactly rows [0, min(rows, 128)).
      const std::int64_t tile = 128 * nvfp4_scale_cols(s);
      std::vector<std::uint8_t> cpu_scales(static_cast<std::size_t>(tile));
      float global = kNvfp4GlobalScale;
      quantize_nvfp4(input, TensorView(cpu_out.data(), DType::kE2M1x2, {r, k / 2}, cpu),
                     TensorView(cpu_scales.data(), DType::kE4M3, {128, nvfp4_scale_cols(s)}, cpu),
                     TensorView(&global, DType::kF32, {1}, cpu));
      const std::vector<std::uint8_t> gpu_scales = to_host<std::uint8_t>(sets.at(2, 0), tile);
      scale_diff = count_diff(cpu_scales, gpu_scales);
      scale_count = tile;
      break;
    }
  }
  out_diff = count_diff(cpu_out, gpu_out);
  if (out_diff == 0 && scale_diff == 0) return concat("ok (", r, " rows bit-exact vs CPU)");
  return concat("MISMATCH vs CPU on ", r, " rows: ", out_diff, "/", gpu_out.size(), " out bytes, ",
                scale_diff, "/", scale_count, " scales");
}

// ---- Measurement -------------------------------------------------------------------------------

struct Options {
  std::vector<std::string> ops;
  std::string shapes = "default";
  int iters = 100;
  int warmup = 10;
  std::string json;
  bool no_pdl = false;
  bool no_check = false;
};

struct Result {
  const OpInfo* op = nullptr;
  Shape shape;
  ByteCount bytes;
  int sets = 0;
  double us = 0, copy_us = 0;
  std::int64_t copy_bytes = 0;
  std::string check;
  std::string skipped;  // why it did not run, or empty
  std::string error;    // the fp8mla::Error it raised, or empty
};

Result make_result(const OpInfo& info, const Shape& shape) {
  Result r;
  r.op = &info;
  r.shape = shape;
  r.bytes = count_bytes(info.op, shape);
  return r;
}

class Bench {
 public:
  explicit Bench(const Options& options)
      : options_(options), props_(cuda::device_props(0)), timer_(options.iters) {}

  std::int64_t rotation_bytes() const { return 2 * props_.l2_bytes; }
  const cuda::DeviceProps& props() const { return props_; }

  // Device-to-device copy of `bytes` bytes (so 2 * bytes moved), median microseconds.
  double copy_us(std::int64_t bytes) {
    if (const auto it = copy_cache_.find(bytes); it != copy_cache_.end()) return it->second;
    const double us = time_device_copy_us(timer_, pool_, bytes, rotation_bytes(), options_.warmup);
    copy_cache_[bytes] = us;
    return us;
  }

  Result run(const OpInfo& info, const Shape& shape) {
    Result res = make_result(info, shape);
    res.skipped = unsupported_reason(info.op, shape);
    if (!res.skipped.empty()) return res;
    {
      const RotatingSets sets(role_bytes(info.op, shape), rotation_bytes());
      res.sets = sets.sets();
      pool_.fill(sets.region(0), sets.region_bytes(0), std::uint64_t(shape.rows * shape.cols));
      for (int role = 1; role < sets.roles(); ++role) {  // poison: unwritten outputs show up
        cuda::check(cudaMemsetAsync(sets.region(role), 0xFF, std::size_t(sets.region_bytes(role))),
                    "cudaMemsetAsync(poison)");
      }
      std::vector<std::byte*> ptrs(std::size_t(sets.roles()));
      res.us = timer_.median_us(
          [&](int k) {
            const int s = k % sets.sets();
            for (int role = 0; role < sets.roles(); ++role)
              ptrs[std::size_t(role)] = sets.at(role, s);
            run_op(info.op, shape, ptrs.data(), global_scale_, Device::cuda(0));
          },
          options_.warmup);
      res.check = options_.no_check ? "not checked" : check_against_cpu(info.op, shape, sets);
    }
    res.copy_bytes = (res.bytes.total() + 1) / 2;
    res.copy_us = copy_us(res.copy_bytes);
    return res;
  }

 private:
  const Options& options_;
  const cuda::DeviceProps& props_;
  EventTimer timer_;
  RandomBf16Pool pool_;
  std::map<std::int64_t, double> copy_cache_;
  DeviceBuffer global_scale_buffer_{4};
  const float* global_scale_ = [this] {
    const float value = kNvfp4GlobalScale;
    cuda::check(cudaMemcpy(global_scale_buffer_.data(), &value, 4, cudaMemcpyHostToDevice),
                "cudaMemcpy(global scale)");
    return reinterpret_cast<const float*>(global_scale_buffer_.data());
  }();
};

// ---- Output ------------------------------------------------------------------------------------

void write_json(const std::string& path, const Options& options, const Bench& bench,
                double ceiling_tbps, const std::vector<Result>& results) {
  std::ofstream f(path);
  if (!f) throw Error(ErrorCategory::kIo, concat("--json: cannot open '", path, "' for writing"));
  const BuildInfo build = build_info();
  f << "{\n  \"benchmark\": \"fp8mla bench quant\",\n";
  f << "  \"date\": " << json_string(utc_now()) << ",\n";
  f << "  \"device\": " << json_string(bench.props().name) << ",\n";
  f << "  \"sm_count\": " << bench.props().sm_count << ",\n";
  f << "  \"l2_bytes\": " << bench.props().l2_bytes << ",\n";
  f << "  \"fp8mla_version\": " << json_string(build.version) << ",\n";
  f << "  \"cuda_version\": " << json_string(build.cuda_version) << ",\n";
  f << "  \"timer\": \"CUDA events around each launch, default stream, median\",\n";
  f << "  \"iters\": " << options.iters << ",\n  \"warmup\": " << options.warmup << ",\n";
  f << "  \"pdl\": " << (options.no_pdl ? "false" : "true") << ",\n";
  f << "  \"shapes\": " << json_string(options.shapes) << ",\n";
  f << "  \"copy_ceiling_tbps\": " << json_number(ceiling_tbps) << ",\n";
  f << "  \"results\": [";
  bool first = true;
  for (const Result& r : results) {
    f << (first ? "\n" : ",\n") << "    {";
    first = false;
    f << "\"op\": " << json_string(r.op->name)
      << ", \"shape\": " << json_string(shape_text(r.shape))
      << ", \"label\": " << json_string(r.shape.label) << ", \"rows\": " << r.shape.rows
      << ", \"cols\": " << r.shape.cols << ", \"bytes\": " << r.bytes.total()
      << ", \"bytes_in\": " << r.bytes.in << ", \"bytes_out\": " << r.bytes.out
      << ", \"bytes_scales\": " << r.bytes.scales;
    if (!r.skipped.empty() || !r.error.empty()) {
      f << ", \"status\": "
        << json_string(r.error.empty() ? "unsupported: " + r.skipped : "error: " + r.error) << "}";
      continue;
    }
    f << ", \"status\": \"ok\", \"sets\": " << r.sets << ", \"us\": " << json_number(r.us)
      << ", \"tbps\": " << json_number(tbps(r.bytes.total(), r.us))
      << ", \"copy_bytes_moved\": " << 2 * r.copy_bytes
      << ", \"copy_us\": " << json_number(r.copy_us)
      << ", \"copy_tbps\": " << json_number(tbps(2 * r.copy_bytes, r.copy_us))
      << ", \"pct_of_copy\": " << json_number(100.0 * r.copy_us / r.us)
      << ", \"check\": " << json_string(r.check) << "}";
  }
  f << "\n  ]\n}\n";
  if (!f) throw Error(ErrorCategory::kIo, concat("--json: writing '", path, "' failed"));
}

void print_row(const Result& r) {
  const double mb = double(r.bytes.total()) / 1e6;
  if (!r.skipped.empty() || !r.error.empty()) {
    std::printf("%-22s %-15s %-30s %10.3f  %s: %s\n", r.op->name, shape_text(r.shape).c_str(),
                r.shape.label.c_str(), mb, r.error.empty() ? "skipped" : "ERROR",
                r.error.empty() ? r.skipped.c_str() : r.error.c_str());
  } else {
    std::printf("%-22s %-15s %-30s %10.3f %10.2f %7.3f %10.2f %7.3f %6.1f%%  %s\n", r.op->name,
                shape_text(r.shape).c_str(), r.shape.label.c_str(), mb, r.us,
                tbps(r.bytes.total(), r.us), r.copy_us, tbps(2 * r.copy_bytes, r.copy_us),
                100.0 * r.copy_us / r.us, r.check.c_str());
  }
  std::fflush(stdout);
}

void run_bench_quant(const Options& options) {
  if (options.iters < 1 || options.warmup < 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("--iters must be >= 1 and --warmup >= 0, got ", options.iters, " and ",
                       options.warmup));
  }
  std::vector<const OpInfo*> ops;
  for (const std::string& name : options.ops) {
    bool found = false;
    for (const OpInfo& info : kOps) {
      if (name == "all" || name == info.name) {
        if (std::find(ops.begin(), ops.end(), &info) == ops.end()) ops.push_back(&info);
        found = true;
      }
    }
    if (!found) {
      std::string known = "all";
      for (const OpInfo& info : kOps) known += concat(", ", info.name);
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("--op: expected one of ", known, "; got '", name, "'"));
    }
  }
  if (ops.empty()) {
    for (const OpInfo& info : kOps) ops.push_back(&info);
  }
  std::vector<std::vector<Shape>> shapes;  // validate every shape list before any GPU work
  for (const OpInfo* info : ops) shapes.push_back(shapes_for(info->op, options.shapes));

  cuda::check(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda::set_pdl_enabled(!options.no_pdl);
  Bench bench(options);
  const cuda::DeviceProps& props = bench.props();
  const std::int64_t ceiling_bytes = std::int64_t(1) << 30;
  const double ceiling_tbps = tbps(2 * ceiling_bytes, bench.copy_us(ceiling_bytes));
  std::printf(
      "fp8mla bench quant on cuda:0 %s (%d SMs, L2 %.0f MiB): %d timed launches after %d "
      "warm-up, median; PDL %s\n",
      props.name.c_str(), props.sm_count, double(props.l2_bytes) / (1 << 20), options.iters,
      options.warmup, options.no_pdl ? "off" : "on");
  std::printf("device copy ceiling: %.3f TB/s (1 GiB copied, read + write counted)\n",
              ceiling_tbps);
  std::printf("%-22s %-15s %-30s %10s %10s %7s %10s %7s %7s  %s\n", "op", "shape", "what", "MB",
              "us", "TB/s", "copy us", "TB/s", "%copy", "check");

  std::vector<Result> results;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    for (const Shape& shape : shapes[i]) {
      try {
        results.push_back(bench.run(*ops[i], shape));
      } catch (const Error& e) {  // recorded; the run goes on, and fails at the end
        cudaGetLastError();       // clear a non-sticky launch error
        Result failed = make_result(*ops[i], shape);
        failed.error = e.what();
        results.push_back(failed);
      }
      print_row(results.back());
    }
  }
  if (!options.json.empty()) {
    write_json(options.json, options, bench, ceiling_tbps, results);
    std::printf("wrote %s\n", options.json.c_str());
  }
  int failures = 0;
  for (const Result& r : results) {
    const bool checked_ok = r.check.rfind("ok", 0) == 0 || r.check == "not checked";
    failures += !r.error.empty() || (r.skipped.empty() && !checked_ok);
  }
  if (failures > 0) {
    throw Error(ErrorCategory::kInternal, concat("bench quant: ", failures,
                                                 " measurement(s) failed or did not match the CPU "
                                                 "implementation (see the table above)"));
  }
}

}  // namespace

void add_bench_quant_command(CLI::App& bench) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "quant",
      "Time the quantization ops on cuda:0 (CUDA events, median, buffers rotated past 2x the L2) "
      "against a device copy of the same bytes");
  std::string op_help = "Ops to time, comma-separated: all";
  for (const OpInfo& info : kOps) op_help += concat(", ", info.name);
  cmd->add_option("--op", options->ops, op_help)->delimiter(',');
  cmd->add_option("--shapes", options->shapes,
                  "Preset (default: T = 1..128k; quick: T = 1, 4k, 128k; large: T = 64k, 128k; "
                  "per-tensor ops add 1M x 512 and 1M x 384) or a list of RxC, e.g. "
                  "1048576x512,4096x7168")
      ->capture_default_str();
  cmd->add_option("--iters", options->iters, "Timed launches per measurement (median)")
      ->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed launches first")->capture_default_str();
  cmd->add_option("--json", options->json, "Also write every measurement to this JSON file");
  cmd->add_flag("--no-pdl", options->no_pdl, "Launch without programmatic dependent launch");
  cmd->add_flag("--no-check", options->no_check, "Skip the bit-exact check against the CPU");
  cmd->callback([options] { run_bench_quant(*options); });
}

}  // namespace fp8mla::cli
