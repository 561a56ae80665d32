// HostBuffer: RAM-tier memory (faulted in and pinned once, off the JS thread).
#pragma once

#include "js/shared_wrap.h"

namespace vsnap::transfer {
class HostBuffer;
}

namespace vsnap::js {

class HostBuffer : public SharedWrap<HostBuffer, transfer::HostBuffer> {
 public:
  static constexpr const char* kName = "HostBuffer";
  static Napi::FunctionReference& constructor(Napi::Env env) { return addonData(env).hostBuffer; }
  static Napi::Function Define(Napi::Env env);
  using SharedWrap::SharedWrap;

 private:
  Napi::Value Size(const Napi::CallbackInfo& info);
  Napi::Value Pinned(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
};

}  // namespace vsnap::js
