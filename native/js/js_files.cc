// Small synchronous helpers: checksums of in-memory data, memfds, flock, descriptor sizes.
#include "hash/checksum.h"
#include "io/files.h"
#include "js/js_util.h"

namespace vsnap::js {
namespace {

Napi::Value Checksum(const Napi::CallbackInfo& info) {
  if (!info[0].IsTypedArray()) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "checksum needs a Buffer or Uint8Array"));
  auto data = info[0].As<Napi::Uint8Array>();
  return Napi::String::New(info.Env(), hash::digest(data.Data(), data.ByteLength()).hex());
}

Napi::Value CreateMemfd(const Napi::CallbackInfo& info) {
  std::string name = toString(info[0], "name");
  uint64_t size = toU64(info[1], "size");
  return Napi::Number::New(info.Env(), guard(info.Env(), [&] { return io::createMemfd(name, size); }));
}

Napi::Value LockFile(const Napi::CallbackInfo& info) {
  std::string path = toString(info[0], "path");
  bool exclusive = info[1].ToBoolean().Value();
  bool readOnly = info.Length() > 2 && info[2].ToBoolean().Value();
  return Napi::Number::New(info.Env(), guard(info.Env(), [&] { return io::lockFile(path, exclusive, true, readOnly); }));
}

Napi::Value FdSize(const Napi::CallbackInfo& info) {
  int fd = static_cast<int>(toI64(info[0], "fd"));
  return Napi::Number::New(info.Env(), static_cast<double>(guard(info.Env(), [&] { return io::fdSize(fd); })));
}

}  // namespace

void initFiles(Napi::Env env, Napi::Object exports) {
  exports.Set("checksum", Napi::Function::New(env, Checksum, "checksum"));
  exports.Set("checksumAlgorithm", Napi::String::New(env, hash::kAlgorithm));
  exports.Set("checksumImplementation", Napi::String::New(env, hash::implementation()));
  exports.Set("createMemfd", Napi::Function::New(env, CreateMemfd, "createMemfd"));
  exports.Set("tryLockFile", Napi::Function::New(env, LockFile, "tryLockFile"));
  exports.Set("fdSize", Napi::Function::New(env, FdSize, "fdSize"));
}

}  // namespace vsnap::js
