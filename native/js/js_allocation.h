// DeviceAllocation: exportable device memory owned by this process (tests, and embedders
// that own their memory). Closing it frees the memory once no transfer still uses it.
#pragma once

#include <napi.h>

#include <memory>

namespace vsnap::cuda {
class Mapping;
}

namespace vsnap::js {

class DeviceAllocation : public Napi::ObjectWrap<DeviceAllocation> {
 public:
  static Napi::Function Define(Napi::Env env);
  DeviceAllocation(const Napi::CallbackInfo& info);

  // The mapping behind a JS DeviceAllocation (throws when value is not one, or is closed).
  static std::shared_ptr<cuda::Mapping> unwrap(const Napi::Value& value);

 private:
  const std::shared_ptr<cuda::Mapping>& live(Napi::Env env) const;
  Napi::Value Address(const Napi::CallbackInfo& info);
  Napi::Value Size(const Napi::CallbackInfo& info);
  Napi::Value Device(const Napi::CallbackInfo& info);
  Napi::Value Closed(const Napi::CallbackInfo& info);
  Napi::Value ExportFd(const Napi::CallbackInfo& info);
  Napi::Value Write(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value Fill(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  std::shared_ptr<cuda::Mapping> mapping_;
};

}  // namespace vsnap::js
