// The shared parts of `fp8mla bench`: buffers, timer, JSON, options and the memory-bound driver.
#include "bench/harness.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/runtime_info.hpp"

namespace fp8mla::cli {

// ---- Buffers -----------------------------------------------------------------------------------

RotatingSets::RotatingSets(const std::vector<std::int64_t>& role_bytes,
                           std::int64_t min_total_bytes) {
  std::int64_t set_bytes = 0;
  for (std::int64_t b : role_bytes) {
    strides_.push_back(round_up(std::max<std::int64_t>(b, 1), 256));
    set_bytes += strides_.back();
  }
  sets_ = int(std::max<std::int64_t>(1, min_total_bytes / set_bytes + 1));
  for (std::int64_t stride : strides_) buffers_.emplace_back(stride * sets_);
}

void RotatingSets::pointers(int set, std::vector<std::byte*>& out) const {
  out.resize(std::size_t(roles()));
  for (int role = 0; role < roles(); ++role) out[std::size_t(role)] = at(role, set);
}

RandomBf16Pool::RandomBf16Pool() : pool_(kElements * 2) {
  std::vector<std::uint16_t> host(static_cast<std::size_t>(kElements));
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  };
  float block_scale = 1.0f;
  for (std::int64_t i = 0; i < kElements; ++i) {
    const std::uint64_t r = next();
    if (i % 64 == 0) block_scale = float(1 << (r >> 62)) / 2.0f;  // 0.5, 1, 2, 4
    const float u = float((r >> 8) & 0xFFFFFF) / float(1 << 24);  // [0, 1)
    const float magnitude = (0.03125f + u * 3.96875f) * block_scale;
    host[std::size_t(i)] = encode_bf16((r & 1) ? -magnitude : magnitude);
  }
  cuda::check(
      cudaMemcpy(pool_.data(), host.data(), std::size_t(pool_.bytes()), cudaMemcpyHostToDevice),
      "cudaMemcpy(random pool)");
}

void RandomBf16Pool::fill(std::byte* dst, std::int64_t bytes, std::uint64_t salt) const {
  std::int64_t offset = std::int64_t((salt * 7919 * 2) % std::uint64_t(pool_.bytes()));
  while (bytes > 0) {
    const std::int64_t n = std::min(bytes, pool_.bytes() - offset);
    cuda::check(cudaMemcpyAsync(dst, pool_.data() + offset, std::size_t(n),
                                cudaMemcpyDeviceToDevice, nullptr),
                "cudaMemcpyAsync(random fill)");
    dst += n;
    bytes -= n;
    offset = 0;
  }
}

void fill_random_e4m3(const RandomBf16Pool& pool, std::byte* dst, std::int64_t count,
                      float scale_inv, std::uint64_t salt, std::uint64_t salt_step) {
  const std::int64_t chunk = RandomBf16Pool::kElements;
  const DeviceBuffer staging(2 * std::min(chunk, count));
  for (std::int64_t done = 0, i = 0; done < count; done += chunk, ++i) {
    const std::int64_t n = std::min(chunk, count - done);
    pool.fill(staging.data(), 2 * n, salt + std::uint64_t(i) * salt_step);
    quantize_fp8(TensorView(staging.data(), DType::kBF16, {n}, Device::cuda(0)),
                 TensorView(dst + done, DType::kE4M3, {n}, Device::cuda(0)), scale_inv);
  }
}

void poison(const RotatingSets& sets, int role) {
  cuda::check(cudaMemsetAsync(sets.region(role), 0xFF, std::size_t(sets.region_bytes(role))),
              "cudaMemsetAsync(poison)");
}

// ---- Timer -------------------------------------------------------------------------------------

void StreamGate::hold(cudaStream_t stream) {
  cuda::check(cudaLaunchHostFunc(stream, &wait, this), "cudaLaunchHostFunc(gate)");
}

void CUDART_CB StreamGate::wait(void* self) {
  auto* gate = static_cast<StreamGate*>(self);
  const auto start = std::chrono::steady_clock::now();
  while (!gate->open_.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(kMaxWaitSeconds)) {
      gate->timed_out_.store(true, std::memory_order_release);
      return;
    }
    std::this_thread::yield();
  }
}

EventTimer::EventTimer(int iters) : events_(std::size_t(2 * iters)) {
  for (cudaEvent_t& e : events_) cuda::check(cudaEventCreate(&e), "cudaEventCreate");
  for (cudaEvent_t& e : settle_marks_) {
    cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
}

EventTimer::~EventTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaEvent_t e : settle_marks_) cudaEventDestroy(e);
}

bool EventTimer::settled(int batch) {
  const auto now = std::chrono::steady_clock::now();
  if (batch == 0) settle_start_ = now;
  return std::chrono::duration<double, std::milli>(now - settle_start_).count() >= settle_ms_;
}

void EventTimer::mark_settle_batch(int batch) {
  cuda::check(cudaEventRecord(settle_marks_[batch % 2], nullptr), "cudaEventRecord(settle)");
  if (batch > 0) {
    cuda::check(cudaEventSynchronize(settle_marks_[(batch - 1) % 2]),
                "cudaEventSynchronize(settle)");
  }
}

void EventTimer::start(StreamGate& gate, bool queued) {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after warm-up)");
  if (queued) gate.hold(nullptr);
}

void EventTimer::record(cudaEvent_t event) {
  cuda::check(cudaEventRecord(event, nullptr), "cudaEventRecord");
}

double EventTimer::finish(StreamGate& gate, bool queued) {
  if (queued) gate.release();
  cuda::check(cudaEventSynchronize(events_.back()), "cudaEventSynchronize");
  cuda::check(cudaGetLastError(), "timed launches");
  if (queued && gate.timed_out()) {
    throw Error(ErrorCategory::kInternal,
                "timer: the timed launches were not all queued behind the gate within 10 s "
                "(does the op synchronize?); rerun with the host-paced timer");
  }
  std::vector<float> ms(events_.size() / 2);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    cuda::check(cudaEventElapsedTime(&ms[i], events_[2 * i], events_[2 * i + 1]),
                "cudaEventElapsedTime");
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t mid = ms.size() / 2;
  const double median = ms.size() % 2 ? ms[mid] : 0.5 * (double(ms[mid - 1]) + ms[mid]);
  return median * 1e3;
}

double time_device_copy_us(EventTimer& timer, const RandomBf16Pool& pool, std::int64_t bytes,
                           std::int64_t rotation_bytes, int warmup, bool queued) {
  const RotatingSets sets({bytes, bytes}, rotation_bytes);
  pool.fill(sets.region(0), sets.region_bytes(0), std::uint64_t(bytes));
  return timer.median_us(
      [&](int k) {
        const int s = k % sets.sets();
        cuda::check(cudaMemcpyAsync(sets.at(1, s), sets.at(0, s), std::size_t(bytes),
                                    cudaMemcpyDeviceToDevice, nullptr),
                    "cudaMemcpyAsync(copy)");
      },
      warmup, queued);
}

// ---- JSON --------------------------------------------------------------------------------------

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string json_bool(bool v) {
  return v ? "true" : "false";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

JsonFields& JsonFields::add(std::string_view key, std::string value) {
  fields_.emplace_back(std::string(key), std::move(value));
  return *this;
}

JsonFields& JsonFields::add(std::string_view key, std::int64_t value) {
  return add(key, std::to_string(value));
}

JsonFields& JsonFields::add_all(const JsonFields& other) {
  fields_.insert(fields_.end(), other.fields_.begin(), other.fields_.end());
  return *this;
}

std::string JsonFields::inner() const {
  std::string out;
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    out += concat(i ? ", " : "", json_string(fields_[i].first), ": ", fields_[i].second);
  }
  return out;
}

std::string JsonFields::lines() const {
  std::string out;
  for (const auto& [key, value] : fields_)
    out += concat("  ", json_string(key), ": ", value, ",\n");
  return out;
}

void write_json_document(const std::string& path, const JsonFields& header,
                         std::string_view array_key, const std::vector<std::string>& objects) {
  std::ofstream f(path);
  if (!f) throw Error(ErrorCategory::kIo, concat("--json: cannot open '", path, "' for writing"));
  f << "{\n" << header.lines() << "  " << json_string(array_key) << ": [";
  for (std::size_t i = 0; i < objects.size(); ++i) f << (i ? ",\n" : "\n") << "    " << objects[i];
  f << "\n  ]\n}\n";
  if (!f) throw Error(ErrorCategory::kIo, concat("--json: writing '", path, "' failed"));
}

JsonFields document_header(std::string_view benchmark, bool full) {
  const cuda::DeviceProps& props = cuda::current_device_props();
  JsonFields header;
  header.add("benchmark", json_string(benchmark)).add("date", json_string(utc_now()));
  header.add("device", json_string(props.name));
  const BuildInfo build = build_info();
  if (full) header.add("sm_count", props.sm_count).add("l2_bytes", props.l2_bytes);
  header.add("fp8mla_version", json_string(build.version));
  if (full) header.add("cuda_version", json_string(build.cuda_version));
  return header;
}

// ---- Options -----------------------------------------------------------------------------------

CLI::App* add_op_command(CLI::App& bench, const char* name, const char* description,
                         CommonOptions& o, const std::vector<std::string>& names) {
  CLI::App* cmd = bench.add_subcommand(name, description);
  std::string help = "Ops to time, comma-separated: all";
  for (const std::string& op : names) help += concat(", ", op);
  cmd->add_option("--op", o.ops, help)->delimiter(',');
  return cmd;
}

void add_timing_options(CLI::App& cmd, CommonOptions& o) {
  cmd.add_option("--iters", o.iters, "Timed launches per measurement (median)")
      ->capture_default_str();
  cmd.add_option("--warmup", o.warmup, "Untimed launches first")->capture_default_str();
}

void add_output_options(CLI::App& cmd, CommonOptions& o) {
  cmd.add_option("--json", o.json, "Also write every measurement to this JSON file");
  cmd.add_flag("--no-pdl", o.no_pdl, "Launch without programmatic dependent launch");
  cmd.add_flag("--no-check", o.no_check, "Skip the bit-exact check against the CPU");
}

void check_timing_options(const CommonOptions& o) {
  if (o.iters < 1 || o.warmup < 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("--iters must be >= 1 and --warmup >= 0, got ", o.iters, " and ", o.warmup));
  }
}

std::vector<std::size_t> select_ops(const std::vector<std::string>& requested,
                                    const std::vector<std::string>& names,
                                    std::string_view option) {
  std::vector<std::size_t> ops;
  for (const std::string& name : requested) {
    bool found = false;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (name == "all" || name == names[i]) {
        if (std::find(ops.begin(), ops.end(), i) == ops.end()) ops.push_back(i);
        found = true;
      }
    }
    if (!found) {
      std::string known = "all";
      for (const std::string& n : names) known += concat(", ", n);
      throw Error(ErrorCategory::kInvalidArgument,
                  concat(option, ": expected one of ", known, "; got '", name, "'"));
    }
  }
  if (ops.empty()) {
    for (std::size_t i = 0; i < names.size(); ++i) ops.push_back(i);
  }
  return ops;
}

void start_device(bool no_pdl) {
  const CudaDevices devices = cuda_devices();
  if (devices.devices.empty()) {
    throw Error(ErrorCategory::kUnsupported,
                concat("fp8mla bench: no usable CUDA device (", devices.unavailable_reason,
                       "); the benchmarks time the CUDA kernels"));
  }
  cuda::check(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda::set_pdl_enabled(!no_pdl);
}

// ---- Memory-bound families ---------------------------------------------------------------------

MemoryBench::MemoryBench(const CommonOptions& options, bool queued)
    : options_(options), queued_(queued), props_(cuda::device_props(0)), timer_(options.iters) {}

double MemoryBench::copy_us(std::int64_t bytes) {
  if (const auto it = copy_cache_.find(bytes); it != copy_cache_.end()) return it->second;
  const double us =
      time_device_copy_us(timer_, pool_, bytes, rotation_bytes(), options_.warmup, queued_);
  copy_cache_[bytes] = us;
  return us;
}

namespace {

bool failed(const MemoryResult& r) {
  const bool checked_ok = r.check.rfind("ok", 0) == 0 || r.check == "not checked";
  return !r.error.empty() || (r.skipped.empty() && !checked_ok);
}

void print_header(const MemoryFamily& f) {
  std::printf("%-*s %-*s", f.op_width, "op", f.shape_width, "shape");
  if (f.label_width) std::printf(" %-*s", f.label_width, "what");
  std::printf(" %10s", "MB");
  if (f.sets_column) std::printf(" %5s", "sets");
  std::printf(" %10s %7s %10s %7s %7s  %s\n", "us", "TB/s", "copy us", "TB/s", "%copy", "check");
}

void print_row(const MemoryFamily& f, const MemoryResult& r) {
  std::printf("%-*s %-*s", f.op_width, r.op.c_str(), f.shape_width, r.shape.c_str());
  if (f.label_width) std::printf(" %-*s", f.label_width, r.label.c_str());
  std::printf(" %10.3f", double(r.bytes) / 1e6);
  if (!r.skipped.empty() || !r.error.empty()) {
    std::printf("  %s: %s\n", r.error.empty() ? "skipped" : "ERROR",
                r.error.empty() ? r.skipped.c_str() : r.error.c_str());
  } else {
    if (f.sets_column) std::printf(" %5d", r.sets);
    std::printf(" %10.2f %7.3f %10.2f %7.3f %6.1f%%  %s\n", r.us, tbps(r.bytes, r.us), r.copy_us,
                tbps(2 * r.copy_bytes, r.copy_us), 100.0 * r.copy_us / r.us, r.check.c_str());
  }
  std::fflush(stdout);
}

std::string json_row(const MemoryResult& r) {
  std::string row = concat("{\"op\": ", json_string(r.op), ", \"shape\": ", json_string(r.shape),
                           ", \"label\": ", json_string(r.label), ", ", r.fields);
  if (!r.skipped.empty() || !r.error.empty()) {
    return concat(row, ", \"status\": ",
                  json_string(r.error.empty() ? "unsupported: " + r.skipped : "error: " + r.error),
                  "}");
  }
  return concat(row, ", \"status\": \"ok\", \"sets\": ", r.sets, ", \"us\": ", json_number(r.us),
                ", \"tbps\": ", json_number(tbps(r.bytes, r.us)),
                ", \"copy_bytes_moved\": ", 2 * r.copy_bytes,
                ", \"copy_us\": ", json_number(r.copy_us),
                ", \"copy_tbps\": ", json_number(tbps(2 * r.copy_bytes, r.copy_us)),
                ", \"pct_of_copy\": ", json_number(100.0 * r.copy_us / r.us),
                ", \"check\": ", json_string(r.check), "}");
}

}  // namespace

void run_memory_bench(const MemoryFamily& family, MemoryBench& bench, std::size_t cases,
                      const std::function<MemoryResult(std::size_t)>& describe,
                      const std::function<void(std::size_t, MemoryResult&)>& measure) {
  const CommonOptions& options = bench.options();
  const cuda::DeviceProps& props = bench.props();
  const std::int64_t ceiling_bytes = std::int64_t(1) << 30;
  const double ceiling_tbps = tbps(2 * ceiling_bytes, bench.copy_us(ceiling_bytes));
  std::printf(
      "fp8mla bench %s on cuda:0 %s (%d SMs, L2 %.0f MiB): %s%d timed launches after %d "
      "warm-up, median%s; PDL %s\n",
      family.name.c_str(), props.name.c_str(), props.sm_count, double(props.l2_bytes) / (1 << 20),
      family.setup.c_str(), options.iters, options.warmup, family.timing.c_str(),
      options.no_pdl ? "off" : "on");
  std::printf("device copy ceiling: %.3f TB/s (1 GiB copied, read + write counted)\n",
              ceiling_tbps);
  print_header(family);

  std::vector<MemoryResult> results;
  for (std::size_t i = 0; i < cases; ++i) {
    MemoryResult r = describe(i);
    try {
      if (r.skipped.empty()) {
        measure(i, r);
        r.copy_bytes = (r.bytes + 1) / 2;
        r.copy_us = bench.copy_us(r.copy_bytes);
      }
    } catch (const Error& e) {  // recorded; the run goes on, and fails at the end
      cudaGetLastError();       // clear a non-sticky launch error
      r = describe(i);
      r.error = e.what();
    }
    print_row(family, r);
    results.push_back(std::move(r));
  }
  if (!options.json.empty()) {
    std::vector<std::string> rows;
    for (const MemoryResult& r : results) rows.push_back(json_row(r));
    JsonFields header = document_header(concat("fp8mla bench ", family.name), true);
    header.add_all(family.run_fields).add("copy_ceiling_tbps", json_number(ceiling_tbps));
    write_json_document(options.json, header, "results", rows);
    std::printf("wrote %s\n", options.json.c_str());
  }
  int failures = 0;
  for (const MemoryResult& r : results) failures += failed(r);
  if (failures > 0) {
    throw Error(ErrorCategory::kInternal,
                concat("bench ", family.name, ": ", failures,
                       " measurement(s) failed or did not match the CPU implementation (see the "
                       "table above)"));
  }
}

}  // namespace fp8mla::cli
