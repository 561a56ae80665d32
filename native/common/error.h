// NativeError: the one exception type the addon throws. Its code is one of the stable
// VsnapError codes (E_CHECKSUM, E_CUDA, ...); the JS layer turns it into a VsnapError.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>

namespace vsnap {

using DetailValue = std::variant<std::string, int64_t, double, bool>;
using Details = std::map<std::string, DetailValue>;

class NativeError : public std::runtime_error {
 public:
  NativeError(std::string code, const std::string& message, Details details = {})
      : std::runtime_error(message), code_(std::move(code)), details_(std::move(details)) {}

  const std::string& code() const { return code_; }
  const Details& details() const { return details_; }

 private:
  std::string code_;
  Details details_;
};

// Throws E_IO (or E_NO_SPACE for ENOSPC/EDQUOT) for a failed system call on a path.
[[noreturn]] void throwSystemError(const std::string& what, const std::string& path, int err);

// Throws E_INVALID_ARGUMENT.
[[noreturn]] void throwInvalid(const std::string& message);

}  // namespace vsnap
