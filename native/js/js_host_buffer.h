// HostBuffer: RAM-tier memory (faulted in and pinned once, off the JS thread).
#pragma once

#include <napi.h>

#include <memory>

namespace vsnap::transfer {
class HostBuffer;
}

namespace vsnap::js {

class HostBuffer : public Napi::ObjectWrap<HostBuffer> {
 public:
  static Napi::Function Define(Napi::Env env);
  HostBuffer(const Napi::CallbackInfo& info);
  static std::shared_ptr<transfer::HostBuffer> unwrap(const Napi::Value& value);

 private:
  Napi::Value Size(const Napi::CallbackInfo& info);
  Napi::Value Pinned(const Napi::CallbackInfo& info);
  Napi::Value Closed(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  const std::shared_ptr<transfer::HostBuffer>& live(Napi::Env env) const;

  std::shared_ptr<transfer::HostBuffer> buffer_;
};

}  // namespace vsnap::js
