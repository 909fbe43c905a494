// fp8mla::Error — the one exception type the library throws.
//
// Every failure (bad input, unsupported configuration, CUDA runtime error) surfaces as an Error
// that names what was expected and what was given, plus where in the library it was detected.
// Library code never exits or aborts on bad input.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace fp8mla {

enum class ErrorCategory {
  kInvalidArgument,  // wrong dtype, shape, stride, alignment, device, value
  kUnsupported,      // valid request this build or device cannot serve
  kOutOfRange,       // index or size past what the data allows
  kCuda,             // CUDA runtime or driver reported an error
  kIo,               // file missing, truncated or malformed
  kInternal,         // a broken library invariant
};

std::string_view category_name(ErrorCategory category);

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, std::string message,
        std::source_location where = std::source_location::current());

  ErrorCategory category() const noexcept { return category_; }
  // The message without the category and location prefix.
  const std::string& message() const noexcept { return message_; }
  const std::source_location& where() const noexcept { return where_; }

 private:
  ErrorCategory category_;
  std::string message_;
  std::source_location where_;
};

// Streams every argument into one string: concat("expected ", 3, " dims").
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace fp8mla
