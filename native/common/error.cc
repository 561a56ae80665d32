#include "common/error.h"

#include <cerrno>
#include <cstring>

namespace vsnap {

void throwSystemError(const std::string& what, const std::string& path, int err) {
  const bool noSpace = err == ENOSPC || err == EDQUOT;
  std::string message = what + (path.empty() ? "" : " '" + path + "'") + ": " + std::strerror(err);
  if (noSpace) message += ". Free space on that file system or choose another store root.";
  Details details{{"errno", static_cast<int64_t>(err)}, {"syscall", what}};
  if (!path.empty()) details["path"] = path;
  throw NativeError(noSpace ? "E_NO_SPACE" : "E_IO", message, std::move(details));
}

void throwInvalid(const std::string& message) { throw NativeError("E_INVALID_ARGUMENT", message); }

}  // namespace vsnap
