#include "js/js_host_buffer.h"

#include "transfer/host_buffer.h"

namespace vsnap::js {

Napi::Function HostBuffer::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, kName,
                                  {InstanceAccessor<&HostBuffer::Size>("size"), InstanceAccessor<&HostBuffer::Pinned>("pinned"),
                                   InstanceAccessor("closed", &HostBuffer::Closed, nullptr), InstanceMethod<&HostBuffer::Read>("read"),
                                   InstanceMethod("close", &HostBuffer::Close)});
  constructor(env) = Napi::Persistent(fn);
  return fn;
}

Napi::Value HostBuffer::Size(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->size()));
}
Napi::Value HostBuffer::Pinned(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), live(info.Env())->pinned()); }

// read(offset, length): a copy of the bytes (tests and diagnostics).
Napi::Value HostBuffer::Read(const Napi::CallbackInfo& info) {
  const auto& b = live(info.Env());
  uint64_t offset = toU64(info[0], "offset");
  uint64_t length = toU64(info[1], "length");
  if (offset > b->size() || length > b->size() - offset) {
    throw toJsError(info.Env(), NativeError("E_OUT_OF_RANGE", "read outside the host buffer"));
  }
  return Napi::Buffer<uint8_t>::Copy(info.Env(), reinterpret_cast<const uint8_t*>(b->data() + offset), length);
}

void initHostBuffer(Napi::Env env, Napi::Object exports) {
  exports.Set("HostBuffer", HostBuffer::Define(env));
  exports.Set("createHostBuffer", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    uint64_t size = toU64(info[0], "size");
    int pinDevice = static_cast<int>(toI64(info[1], "pinDevice"));
    return PromiseWorker<std::shared_ptr<transfer::HostBuffer>>::Run(
        info.Env(), [=] { return std::make_shared<transfer::HostBuffer>(size, pinDevice); },
        [](Napi::Env env, std::shared_ptr<transfer::HostBuffer>& b) { return HostBuffer::wrap(env, b); });
  }, "createHostBuffer"));
}

}  // namespace vsnap::js
