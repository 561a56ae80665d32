// cuda.status(), cuda.devices(): what the driver reports, off the JS thread (cuInit and
// context creation can take a second).
#include "cuda/context.h"
#include "cuda/devices.h"
#include "cuda/driver.h"
#include "js/js_util.h"

namespace vsnap::js {
namespace {

Napi::Object statusToJs(Napi::Env env, const cuda::Status& s) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("available", s.available);
  o.Set("reason", s.reason);
  o.Set("driverVersion", s.driverVersion);
  o.Set("library", s.library);
  o.Set("checkpointApi", s.checkpointApi);
  return o;
}

Napi::Value Status(const Napi::CallbackInfo& info) {
  return PromiseWorker<cuda::Status>::Run(
      info.Env(), [] { return cuda::status(); },
      [](Napi::Env env, cuda::Status& s) -> Napi::Value { return statusToJs(env, s); });
}

Napi::Value Devices(const Napi::CallbackInfo& info) {
  bool withFree = info.Length() > 0 && info[0].ToBoolean().Value();
  return PromiseWorker<std::vector<cuda::DeviceInfo>>::Run(
      info.Env(),
      [withFree] {
        std::vector<cuda::DeviceInfo> out;
        int n = cuda::deviceCount();
        for (int i = 0; i < n; i++) out.push_back(cuda::deviceInfo(i, withFree));
        return out;
      },
      [](Napi::Env env, std::vector<cuda::DeviceInfo>& list) -> Napi::Value {
        Napi::Array arr = Napi::Array::New(env, list.size());
        for (size_t i = 0; i < list.size(); i++) {
          const auto& d = list[i];
          Napi::Object o = Napi::Object::New(env);
          o.Set("ordinal", d.ordinal);
          o.Set("name", d.name);
          o.Set("uuid", d.uuid);
          o.Set("pciBusId", d.pciBusId);
          o.Set("computeCapability", std::to_string(d.computeCapabilityMajor) + "." + std::to_string(d.computeCapabilityMinor));
          o.Set("totalMemory", static_cast<double>(d.totalMemory));
          o.Set("freeMemory", d.freeMemory < 0 ? env.Null() : Napi::Number::New(env, static_cast<double>(d.freeMemory)));
          o.Set("vmmGranularity", static_cast<double>(d.vmmGranularity));
          o.Set("vmmSupported", d.vmmSupported);
          o.Set("posixFdHandlesSupported", d.posixFdHandlesSupported);
          arr.Set(i, o);
        }
        return arr;
      });
}

Napi::Value HoldsContext(const Napi::CallbackInfo& info) {
  int ordinal = static_cast<int>(toI64(info[0], "device"));
  return Napi::Boolean::New(info.Env(), cuda::holdsContext(ordinal));
}

// cudaKeepContext(device): Promise<void>, cudaReleaseContext(device): Promise<void> (off the JS
// thread: creating or destroying a context takes 0.1-0.3 s).
Napi::Value KeepContext(const Napi::CallbackInfo& info) {
  int ordinal = static_cast<int>(toI64(info[0], "device"));
  return PromiseWorker<bool>::Run(
      info.Env(), [ordinal] { cuda::keepContext(ordinal); return true; },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); });
}

Napi::Value ReleaseContext(const Napi::CallbackInfo& info) {
  int ordinal = static_cast<int>(toI64(info[0], "device"));
  return PromiseWorker<bool>::Run(
      info.Env(), [ordinal] { cuda::releaseKeptContext(ordinal); return true; },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); });
}

}  // namespace

void initCuda(Napi::Env env, Napi::Object exports) {
  exports.Set("cudaStatus", Napi::Function::New(env, Status, "cudaStatus"));
  exports.Set("cudaDevices", Napi::Function::New(env, Devices, "cudaDevices"));
  exports.Set("cudaHoldsContext", Napi::Function::New(env, HoldsContext, "cudaHoldsContext"));
  exports.Set("cudaKeepContext", Napi::Function::New(env, KeepContext, "cudaKeepContext"));
  exports.Set("cudaReleaseContext", Napi::Function::New(env, ReleaseContext, "cudaReleaseContext"));
}

}  // namespace vsnap::js
