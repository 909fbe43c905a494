// The harness every `fp8mla bench` family runs on (CUDA builds only): JSON documents, the shared
// command-line options, op selection, and the driver of the memory-bound families (`bench quant`,
// `bench prep`): each (op, shape) timed on rotating buffer sets, next to a device-to-device copy
// of the same byte count timed the same way, checked against the CPU, printed as a table row,
// written to JSON, and the run failed at the end if any row failed or mismatched.
// A family file holds only its table of ops and shapes, their bytes and their run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/device.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cli {

// ---- JSON output -------------------------------------------------------------------------------

std::string json_string(std::string_view s);
std::string json_number(double v);
std::string json_bool(bool v);
std::string utc_now();

// "key": value pairs in order; values are JSON text (json_string, json_number, ...).
class JsonFields {
 public:
  JsonFields& add(std::string_view key, std::string value);
  JsonFields& add(std::string_view key, std::int64_t value);
  JsonFields& add_all(const JsonFields& other);
  // {"a": 1, "b": 2}
  std::string object() const { return "{" + inner() + "}"; }
  // "a": 1, "b": 2
  std::string inner() const;
  // The fields one per line, 2-space indented, each followed by ",\n".
  std::string lines() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// Writes {<header lines>, "<array_key>": [<one object per line>]} to `path` (the --json file).
void write_json_document(const std::string& path, const JsonFields& header,
                         std::string_view array_key, const std::vector<std::string>& objects);

// The fields every family's document starts with: benchmark, date, device, and (`full`) the SM
// count, L2 size, fp8mla and CUDA versions.
JsonFields document_header(std::string_view benchmark, bool full);

// ---- Options -----------------------------------------------------------------------------------

// What `--op`, `--iters`, `--warmup`, `--json`, `--no-pdl` and `--no-check` set.
struct CommonOptions {
  std::vector<std::string> ops;
  int iters = 100;
  int warmup = 10;
  std::string json;
  bool no_pdl = false;
  bool no_check = false;
};

// The subcommand `name` of a memory-bound family with --op NAMES (comma-separated; `names` are
// the family's ops, "all" selects every one).
CLI::App* add_op_command(CLI::App& bench, const char* name, const char* description,
                         CommonOptions& o, const std::vector<std::string>& names);
void add_timing_options(CLI::App& cmd, CommonOptions& o);  // --iters, --warmup
void add_output_options(CLI::App& cmd, CommonOptions& o);  // --json, --no-pdl, --no-check

// Registers `fp8mla bench <name>` of a memory-bound family: --op, the family's own options
// (add_options(cmd, options)), then --iters, --warmup, --json, --no-pdl and --no-check; the
// command runs run(options).
template <typename Options, typename AddOptions>
void add_memory_command(CLI::App& bench, const char* name, const char* description,
                        const std::vector<std::string>& ops, void (*run)(const Options&),
                        AddOptions add_options) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = add_op_command(bench, name, description, *options, ops);
  add_options(*cmd, *options);
  add_timing_options(*cmd, *options);
  add_output_options(*cmd, *options);
  cmd->callback([options, run] { run(*options); });
}

// Throws unless iters >= 1 and warmup >= 0.
void check_timing_options(const CommonOptions& o);

// One entry of a family's op table: the op, its name (on the command line, in the JSON and the
// table) and what it does.
template <typename Op>
struct OpEntry {
  Op op;
  const char* name;
  const char* what;
};

// The `name` of each entry of an op table.
template <typename Info, std::size_t N>
std::vector<std::string> names_of(const Info (&table)[N]) {
  std::vector<std::string> names;
  for (const Info& info : table) names.push_back(info.name);
  return names;
}

// The indices into `names` that `requested` selects, in order and without repeats; all of them
// when `requested` is empty. Throws on an unknown name, naming `option` (the command-line option).
std::vector<std::size_t> select_ops(const std::vector<std::string>& requested,
                                    const std::vector<std::string>& names,
                                    std::string_view option = "--op");

// cudaSetDevice(0) and the programmatic-dependent-launch switch.
void start_device(bool no_pdl);

// ---- Memory-bound families ---------------------------------------------------------------------

// The device, the timer, the random pool and the copy baseline of a memory-bound family: buffer
// sets rotate through more than 2x the L2 (rotation_bytes), launches are timed by one EventTimer.
class MemoryBench {
 public:
  MemoryBench(const CommonOptions& options, bool queued);

  const cuda::DeviceProps& props() const { return props_; }
  std::int64_t rotation_bytes() const { return 2 * props_.l2_bytes; }
  const RandomBf16Pool& pool() const { return pool_; }
  const CommonOptions& options() const { return options_; }
  bool queued() const { return queued_; }

  // Median microseconds of `launch(k)` (k: the launch's index, to rotate sets).
  template <typename Launch>
  double time_us(Launch&& launch) {
    return timer_.median_us(launch, options_.warmup, queued_);
  }
  // Device-to-device copy of `bytes` bytes (so 2 * bytes moved), median microseconds; cached.
  double copy_us(std::int64_t bytes);

 private:
  const CommonOptions& options_;
  bool queued_;
  const cuda::DeviceProps& props_;
  EventTimer timer_;
  RandomBf16Pool pool_;
  std::map<std::int64_t, double> copy_cache_;
};

// One (op, shape) of a memory-bound family. describe() fills what it is; measure() the rest.
struct MemoryResult {
  std::string op;
  std::string shape;       // e.g. "4096x512", "T=4096 H=128"
  std::string label;       // what the rows are (or what the op does)
  std::string fields;      // the family's JSON fields after "label" (sizes, byte counts)
  std::int64_t bytes = 0;  // counted bytes: each input read and each output written once
  int sets = 0;
  double us = 0;
  std::string check;    // "ok (...)", "not checked" or the mismatch
  std::string skipped;  // why it did not run, or empty
  std::string error;    // the fp8mla::Error it raised, or empty
  std::int64_t copy_bytes = 0;
  double copy_us = 0;
};

// How a family prints and records its rows.
struct MemoryFamily {
  std::string name;  // "quant": `fp8mla bench quant`
  int op_width = 0;  // table column widths
  int shape_width = 0;
  int label_width = 0;       // 0: no label column
  bool sets_column = false;  // print the number of buffer sets
  std::string setup;         // banner text before the timing ("H=128, ...; "), or empty
  std::string timing;        // banner text after "median" (", queued back to back"), or empty
  JsonFields run_fields;     // the document's fields between the header and the copy ceiling
};

// Times and prints `cases` rows: describe(i), then (unless skipped) measure(i, result), then the
// copy of half the counted bytes. A row that throws fp8mla::Error is recorded and the run goes
// on; after the JSON is written, throws if any row failed or did not match the CPU.
void run_memory_bench(const MemoryFamily& family, MemoryBench& bench, std::size_t cases,
                      const std::function<MemoryResult(std::size_t)>& describe,
                      const std::function<void(std::size_t, MemoryResult&)>& measure);

// Fills every set of `role` with 0xFF, so that output bytes an op leaves unwritten show up in
// the check against the CPU.
void poison(const RotatingSets& sets, int role);

}  // namespace fp8mla::cli
