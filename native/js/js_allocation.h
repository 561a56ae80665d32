// DeviceAllocation: exportable device memory owned by this process (tests, and embedders
// that own their memory). Closing it frees the memory once no transfer still uses it.
#pragma once

#include "js/shared_wrap.h"

namespace vsnap::cuda {
class Mapping;
}

namespace vsnap::js {

class DeviceAllocation : public SharedWrap<DeviceAllocation, cuda::Mapping> {
 public:
  static constexpr const char* kName = "DeviceAllocation";
  static Napi::FunctionReference& constructor(Napi::Env env) { return addonData(env).deviceAllocation; }
  static Napi::Function Define(Napi::Env env);
  using SharedWrap::SharedWrap;

 private:
  Napi::Value Address(const Napi::CallbackInfo& info);
  Napi::Value Size(const Napi::CallbackInfo& info);
  Napi::Value Device(const Napi::CallbackInfo& info);
  Napi::Value ExportFd(const Napi::CallbackInfo& info);
  Napi::Value Write(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value Fill(const Napi::CallbackInfo& info);
};

}  // namespace vsnap::js
