#include "js/js_allocation.h"

#include "cuda/vmm.h"
#include "cuda/vmm_alloc_set.h"

namespace vsnap::js {

Napi::Function DeviceAllocation::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, kName,
                                  {InstanceAccessor<&DeviceAllocation::Address>("address"),
                                   InstanceAccessor<&DeviceAllocation::Size>("size"),
                                   InstanceAccessor<&DeviceAllocation::Device>("device"),
                                   InstanceAccessor("closed", &DeviceAllocation::Closed, nullptr),
                                   InstanceMethod<&DeviceAllocation::ExportFd>("exportFd"),
                                   InstanceMethod<&DeviceAllocation::Write>("write"),
                                   InstanceMethod<&DeviceAllocation::Read>("read"),
                                   InstanceMethod<&DeviceAllocation::Fill>("fill"),
                                   InstanceMethod("close", &DeviceAllocation::Close)});
  constructor(env) = Napi::Persistent(fn);
  return fn;
}

Napi::Value DeviceAllocation::Address(const Napi::CallbackInfo& info) {
  return Napi::BigInt::New(info.Env(), live(info.Env())->address());
}
Napi::Value DeviceAllocation::Size(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->size()));
}
Napi::Value DeviceAllocation::Device(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), live(info.Env())->device());
}

Napi::Value DeviceAllocation::ExportFd(const Napi::CallbackInfo& info) {
  auto m = live(info.Env());
  return Napi::Number::New(info.Env(), guard(info.Env(), [&] { return m->exportFd(); }));
}

Napi::Value DeviceAllocation::Write(const Napi::CallbackInfo& info) {
  auto m = live(info.Env());
  uint64_t offset = toU64(info[0], "offset");
  if (!info[1].IsTypedArray()) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "data must be a Buffer or Uint8Array"));
  auto data = info[1].As<Napi::Uint8Array>();
  const uint8_t* ptr = data.Data();
  uint64_t length = data.ByteLength();
  return PromiseWorker<bool>::Run(
      info.Env(), [m, offset, ptr, length] { m->copyFromHost(offset, ptr, length); return true; },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info[1]});
}

Napi::Value DeviceAllocation::Read(const Napi::CallbackInfo& info) {
  auto m = live(info.Env());
  uint64_t offset = toU64(info[0], "offset");
  uint64_t length = toU64(info[1], "length");
  if (offset > m->size() || length > m->size() - offset) {
    throw toJsError(info.Env(), NativeError("E_OUT_OF_RANGE", "read outside the allocation"));
  }
  Napi::Buffer<uint8_t> out = Napi::Buffer<uint8_t>::New(info.Env(), length);
  uint8_t* ptr = out.Data();
  return PromiseWorker<bool>::Run(
      info.Env(), [m, offset, ptr, length] { m->copyToHost(offset, ptr, length); return true; },
      [ref = std::make_shared<Napi::Reference<Napi::Buffer<uint8_t>>>(Napi::Persistent(out))](Napi::Env, bool&) -> Napi::Value {
        return ref->Value();
      });
}

Napi::Value DeviceAllocation::Fill(const Napi::CallbackInfo& info) {
  auto m = live(info.Env());
  uint64_t offset = toU64(info[0], "offset");
  uint64_t length = toU64(info[1], "length");
  uint8_t value = static_cast<uint8_t>(toU64(info[2], "value") & 0xff);
  return PromiseWorker<bool>::Run(
      info.Env(), [m, offset, length, value] { m->fill(offset, length, value); return true; },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); });
}

void initAllocation(Napi::Env env, Napi::Object exports) {
  exports.Set("DeviceAllocation", DeviceAllocation::Define(env));
  exports.Set("allocateDevice", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    int device = static_cast<int>(toI64(info[0], "device"));
    uint64_t size = toU64(info[1], "size");
    return PromiseWorker<std::shared_ptr<cuda::Mapping>>::Run(
        info.Env(), [device, size] { return std::shared_ptr<cuda::Mapping>(cuda::Mapping::allocate(device, size)); },
        [](Napi::Env env, std::shared_ptr<cuda::Mapping>& m) { return DeviceAllocation::wrap(env, m); });
  }, "allocateDevice"));
  // allocateDeviceSet(device, sizes): one DeviceAllocation a size, made together (cuda/vmm_alloc_set.h);
  // the memory goes once every one of them is closed.
  exports.Set("allocateDeviceSet", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    int device = static_cast<int>(toI64(info[0], "device"));
    if (!info[1].IsArray()) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "sizes must be an array of byte counts"));
    auto list = info[1].As<Napi::Array>();
    std::vector<uint64_t> sizes;
    for (uint32_t i = 0; i < list.Length(); i++) sizes.push_back(toU64(list.Get(i), "sizes[i]"));
    using Views = std::vector<std::shared_ptr<cuda::Mapping>>;
    return PromiseWorker<Views>::Run(
        info.Env(),
        [device, sizes] {
          auto set = cuda::AllocationSet::allocate(device, sizes);
          Views views;
          for (size_t i = 0; i < set->count(); i++) views.push_back(set->view(i));
          return views;
        },
        [](Napi::Env env, Views& views) -> Napi::Value {
          Napi::Array out = Napi::Array::New(env, views.size());
          for (size_t i = 0; i < views.size(); i++) out.Set(static_cast<uint32_t>(i), DeviceAllocation::wrap(env, views[i]));
          return out;
        });
  }, "allocateDeviceSet"));
}

}  // namespace vsnap::js
