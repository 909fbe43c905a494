// Reading and writing safetensors files (the format DeepSeek ships its weights in): an 8-byte
// little-endian header length, a JSON header {"name": {"dtype", "shape", "data_offsets"}, ...},
// then the tensor bytes. The reader maps the file and checks the header against it (dtypes,
// shapes, offsets inside the file, byte counts): a malformed or truncated file is an
// ErrorCategory::kIo error naming the file and what is wrong. In fp8mla::model: it parses the
// header with nlohmann_json, so a build without it has no fp8mla::model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8mla/dtype.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  // inside the mapping, valid while the file is open
  std::int64_t bytes = 0;

  // A contiguous read-only-in-spirit CPU view (the mapping is read-only: do not write to it).
  TensorView view() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and reads its header; throws ErrorCategory::kIo on any inconsistency.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;  // nullptr when absent
  // The tensor `name`; ErrorCategory::kIo naming the file when absent.
  const SafetensorsTensor& at(std::string_view name) const;

 private:
  std::string path_;
  void* mapping_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;  // sorted by name
};

// Writes contiguous CPU views under their names (dtypes bf16, f16, f32, e4m3, e5m2, i32, i64).
void write_safetensors(const std::string& path,
                       std::span<const std::pair<std::string, TensorView>> tensors);

}  // namespace fp8mla
