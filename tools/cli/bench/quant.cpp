// `fp8mla bench quant`: times the quantization ops (docs/design.md section 3, ops 1-3) on CUDA
// device 0 through the public C++ API and the default stream, next to a device-to-device copy of
// the same byte count measured the same way.
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
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/harness.hpp"
#include "commands.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/quantize.hpp"

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

using OpInfo = OpEntry<Op>;

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

// ---- Run ---------------------------------------------------------------------------------------

struct Options : CommonOptions {
  std::string shapes = "default";
};

// The NVFP4 global scale, on the device.
class GlobalScale {
 public:
  GlobalScale() {
    const float value = kNvfp4GlobalScale;
    cuda::check(cudaMemcpy(buffer_.data(), &value, 4, cudaMemcpyHostToDevice),
                "cudaMemcpy(global scale)");
  }
  const float* get() const { return reinterpret_cast<const float*>(buffer_.data()); }

 private:
  DeviceBuffer buffer_{4};
};

struct Case {
  const OpInfo* op;
  Shape shape;
};

MemoryResult describe(const Case& c) {
  const ByteCount b = count_bytes(c.op->op, c.shape);
  MemoryResult r;
  r.op = c.op->name;
  r.shape = shape_text(c.shape);
  r.label = c.shape.label;
  r.fields = JsonFields()
                 .add("rows", c.shape.rows)
                 .add("cols", c.shape.cols)
                 .add("bytes", b.total())
                 .add("bytes_in", b.in)
                 .add("bytes_out", b.out)
                 .add("bytes_scales", b.scales)
                 .inner();
  r.bytes = b.total();
  r.skipped = unsupported_reason(c.op->op, c.shape);
  return r;
}

void measure(const Case& c, MemoryBench& bench, const GlobalScale& global_scale, MemoryResult& r) {
  const RotatingSets sets(role_bytes(c.op->op, c.shape), bench.rotation_bytes());
  r.sets = sets.sets();
  bench.pool().fill(sets.region(0), sets.region_bytes(0),
                    std::uint64_t(c.shape.rows * c.shape.cols));
  for (int role = 1; role < sets.roles(); ++role) poison(sets, role);
  std::vector<std::byte*> ptrs;
  r.us = bench.time_us([&](int k) {
    sets.pointers(k % sets.sets(), ptrs);
    run_op(c.op->op, c.shape, ptrs.data(), global_scale.get(), Device::cuda(0));
  });
  r.check = bench.options().no_check ? "not checked" : check_against_cpu(c.op->op, c.shape, sets);
}

void run_bench_quant(const Options& options) {
  check_timing_options(options);
  std::vector<Case> cases;  // every shape list is validated before any GPU work
  for (std::size_t op : select_ops(options.ops, names_of(kOps))) {
    for (const Shape& s : shapes_for(kOps[op].op, options.shapes)) cases.push_back({&kOps[op], s});
  }
  start_device(options.no_pdl);
  MemoryBench bench(options, /*queued=*/false);
  const GlobalScale global_scale;
  MemoryFamily family{"quant", 22, 15, 30, /*sets_column=*/false, "", "", {}};
  family.run_fields
      .add("timer", json_string("CUDA events around each launch, default stream, "
                                "median"))
      .add("iters", options.iters)
      .add("warmup", options.warmup)
      .add("pdl", json_bool(!options.no_pdl))
      .add("shapes", json_string(options.shapes));
  run_memory_bench(
      family, bench, cases.size(), [&](std::size_t i) { return describe(cases[i]); },
      [&](std::size_t i, MemoryResult& r) { measure(cases[i], bench, global_scale, r); });
}

}  // namespace

void add_bench_quant_command(CLI::App& bench) {
  add_memory_command(
      bench, "quant",
      "Time the quantization ops on cuda:0 (CUDA events, median, buffers rotated past 2x the L2) "
      "against a device copy of the same bytes",
      names_of(kOps), &run_bench_quant, [](CLI::App& cmd, Options& o) {
        cmd.add_option("--shapes", o.shapes,
                       "Preset (default: T = 1..128k; quick: T = 1, 4k, 128k; large: T = 64k, "
                       "128k; per-tensor ops add 1M x 512 and 1M x 384) or a list of RxC, e.g. "
                       "1048576x512,4096x7168")
            ->capture_default_str();
      });
}

}  // namespace fp8mla::cli
