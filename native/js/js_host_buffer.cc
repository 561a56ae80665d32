#include "js/js_host_buffer.h"

#include <cstring>

#include "js/js_util.h"
#include "transfer/host_buffer.h"

namespace vsnap::js {

Napi::Function HostBuffer::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, "HostBuffer",
                                  {InstanceAccessor<&HostBuffer::Size>("size"), InstanceAccessor<&HostBuffer::Pinned>("pinned"),
                                   InstanceAccessor<&HostBuffer::Closed>("closed"), InstanceMethod<&HostBuffer::Read>("read"),
                                   InstanceMethod<&HostBuffer::Close>("close")});
  addonData(env).hostBuffer = Napi::Persistent(fn);
  return fn;
}

HostBuffer::HostBuffer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<HostBuffer>(info) {
  if (info.Length() != 1 || !info[0].IsExternal()) {
    throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "use createHostBuffer() to create a HostBuffer"));
  }
  buffer_ = *info[0].As<Napi::External<std::shared_ptr<transfer::HostBuffer>>>().Data();
}

std::shared_ptr<transfer::HostBuffer> HostBuffer::unwrap(const Napi::Value& value) {
  Napi::Env env = value.Env();
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(addonData(env).hostBuffer.Value())) {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "expected a HostBuffer"));
  }
  return Unwrap(value.As<Napi::Object>())->live(env);
}

const std::shared_ptr<transfer::HostBuffer>& HostBuffer::live(Napi::Env env) const {
  if (!buffer_) throw toJsError(env, NativeError("E_CLOSED", "this HostBuffer was closed"));
  return buffer_;
}

Napi::Value HostBuffer::Size(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->size()));
}
Napi::Value HostBuffer::Pinned(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), live(info.Env())->pinned()); }
Napi::Value HostBuffer::Closed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), !buffer_); }

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

// Drops this handle; the memory is unpinned and freed once running transfers let go of it.
Napi::Value HostBuffer::Close(const Napi::CallbackInfo& info) {
  buffer_.reset();
  return info.Env().Undefined();
}

void initHostBuffer(Napi::Env env, Napi::Object exports) {
  exports.Set("HostBuffer", HostBuffer::Define(env));
  exports.Set("createHostBuffer", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    uint64_t size = toU64(info[0], "size");
    int pinDevice = static_cast<int>(toI64(info[1], "pinDevice"));
    return PromiseWorker<std::shared_ptr<transfer::HostBuffer>>::Run(
        info.Env(), [=] { return std::make_shared<transfer::HostBuffer>(size, pinDevice); },
        [](Napi::Env env, std::shared_ptr<transfer::HostBuffer>& b) -> Napi::Value {
          std::shared_ptr<transfer::HostBuffer> holder = b;
          return addonData(env).hostBuffer.New({Napi::External<std::shared_ptr<transfer::HostBuffer>>::New(env, &holder)});
        });
  }, "createHostBuffer"));
}

}  // namespace vsnap::js
