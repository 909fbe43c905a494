#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

std::string format_what(ErrorCategory category, const std::string& message,
                        const std::source_location& where) {
  return concat("fp8mla ", category_name(category), " error: ", message, " [", where.file_name(),
                ":", where.line(), "]");
}

}  // namespace

std::string_view category_name(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInvalidArgument:
      return "invalid-argument";
    case ErrorCategory::kUnsupported:
      return "unsupported";
    case ErrorCategory::kOutOfRange:
      return "out-of-range";
    case ErrorCategory::kCuda:
      return "cuda";
    case ErrorCategory::kIo:
      return "io";
    case ErrorCategory::kInternal:
      return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCategory category, std::string message, std::source_location where)
    : std::runtime_error(format_what(category, message, where)),
      category_(category),
      message_(std::move(message)),
      where_(where) {}

}  // namespace fp8mla
