#include "fp8mla/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

constexpr std::pair<std::string_view, DType> kDtypes[] = {
    {"BF16", DType::kBF16},    {"F16", DType::kF16},      {"F32", DType::kF32},
    {"F8_E4M3", DType::kE4M3}, {"F8_E5M2", DType::kE5M2}, {"I32", DType::kI32},
    {"I64", DType::kI64}};

// Headers beyond this are not weight files (the format's own readers cap them likewise).
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t(100) << 20;

Error io_error(const std::string& path, const std::string& what) {
  return Error(ErrorCategory::kIo, concat("safetensors file '", path, "': ", what));
}

std::string_view dtype_tag(DType dtype, const std::string& name) {
  for (const auto& [tag, d] : kDtypes) {
    if (d == dtype) return tag;
  }
  throw Error(ErrorCategory::kInvalidArgument,
              concat("write_safetensors: tensor '", name, "' has dtype ", dtype_name(dtype),
                     ", which safetensors cannot hold"));
}

}  // namespace

TensorView SafetensorsTensor::view() const {
  return TensorView(const_cast<std::byte*>(data), dtype, shape);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw io_error(path, concat("cannot open (", std::strerror(errno), ")"));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    throw io_error(path, "shorter than the 8-byte header length");
  }
  mapped_bytes_ = std::size_t(st.st_size);
  mapping_ = ::mmap(nullptr, mapped_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw io_error(path, concat("cannot map (", std::strerror(errno), ")"));
  }
  const auto* bytes = static_cast<const std::byte*>(mapping_);
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | std::uint8_t(bytes[i]);
  const std::uint64_t file_bytes = mapped_bytes_;
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    throw io_error(path, concat("header length ", header_bytes, " does not fit the file (",
                                file_bytes, " bytes)"));
  }
  const std::byte* data = bytes + 8 + header_bytes;
  const std::uint64_t data_bytes = file_bytes - 8 - header_bytes;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8),
                                   reinterpret_cast<const char*>(data));
  } catch (const nlohmann::json::exception& e) {
    throw io_error(path, concat("header is not valid JSON (", e.what(), ")"));
  }
  if (!header.is_object()) throw io_error(path, "header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) {
      return io_error(path, concat("tensor '", name, "': ", what));
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      throw bad("expected an object with dtype, shape and data_offsets");
    }
    SafetensorsTensor t;
    t.name = name;
    const std::string tag = entry["dtype"].is_string() ? entry["dtype"].get<std::string>() : "";
    const auto* known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                     [&](const auto& d) { return d.first == tag; });
    if (known == std::end(kDtypes)) throw bad(concat("unsupported dtype '", tag, "'"));
    t.dtype = known->second;
    std::uint64_t elements = 1;
    if (!entry["shape"].is_array()) throw bad("shape is not an array");
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape holds a value that is not a size");
      const std::uint64_t n = d.get<std::uint64_t>();
      if (n > 0 && elements > std::numeric_limits<std::uint64_t>::max() / n / 8) {
        throw bad("shape too large");
      }
      elements *= n;
      t.shape.push_back(std::int64_t(n));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw bad("data_offsets is not [begin, end]");
    }
    const std::uint64_t begin = offsets[0].get<std::uint64_t>(),
                        end = offsets[1].get<std::uint64_t>();
    const std::uint64_t expected = elements * std::uint64_t(dtype_size(t.dtype));
    if (begin > end || end - begin != expected) {
      throw bad(concat("data_offsets [", begin, ", ", end, ") hold ", end - begin,
                       " bytes, the shape and dtype need ", expected));
    }
    if (end > data_bytes) {
      throw bad(concat("data ends at byte ", end, " of the data section, which has ", data_bytes,
                       " (truncated file?)"));
    }
    t.data = data + begin;
    t.bytes = std::int64_t(expected);
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      tensors_(std::move(other.tensors_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    tensors_ = std::move(other.tensors_);
  }
  return *this;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  if (t == nullptr) throw io_error(path_, concat("has no tensor '", name, "'"));
  return *t;
}

void write_safetensors(const std::string& path,
                       std::span<const std::pair<std::string, TensorView>> tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, view] : tensors) {
    if (view.device().is_cuda() || !view.is_contiguous()) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("write_safetensors: tensor '", name,
                         "' must be a contiguous CPU view, got ", view.describe()));
    }
    const std::uint64_t bytes = std::uint64_t(view.numel()) * dtype_size(view.dtype());
    std::vector<std::int64_t> shape;
    for (int d = 0; d < view.ndim(); ++d) shape.push_back(view.size(d));
    header[name] = {{"dtype", dtype_tag(view.dtype(), name)},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(path, "cannot open for writing");
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& [name, view] : tensors) {
    out.write(static_cast<const char*>(view.data()),
              std::streamsize(view.numel() * dtype_size(view.dtype())));
  }
  if (!out) throw io_error(path, "write failed");
}

}  // namespace fp8mla
