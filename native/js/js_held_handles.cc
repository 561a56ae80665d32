// holdHandles(fds) -> Promise<HeldHandles>: references to exported device memory (tier 0), kept
// until close(); no mapping is made.
#include "cuda/vmm.h"
#include "js/parallel.h"
#include "js/shared_wrap.h"

namespace vsnap::js {
namespace {

using Handles = std::vector<std::unique_ptr<cuda::HeldHandle>>;

class HeldHandles : public SharedWrap<HeldHandles, Handles> {
 public:
  static constexpr const char* kName = "HeldHandles";
  static Napi::FunctionReference& constructor(Napi::Env env) { return addonData(env).heldHandles; }
  static Napi::Function Define(Napi::Env env) {
    Napi::Function fn = DefineClass(env, kName,
                                    {InstanceAccessor<&HeldHandles::Count>("count"), InstanceAccessor("closed", &HeldHandles::Closed, nullptr),
                                     InstanceMethod("close", &HeldHandles::Close)});
    constructor(env) = Napi::Persistent(fn);
    return fn;
  }
  using SharedWrap::SharedWrap;

 private:
  Napi::Value Count(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->size())); }
};

}  // namespace

void initHeldHandles(Napi::Env env, Napi::Object exports) {
  exports.Set("HeldHandles", HeldHandles::Define(env));
  exports.Set("holdHandles", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    if (!info[0].IsArray()) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "holdHandles needs an array of fds"));
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<int> fds;
    for (uint32_t i = 0; i < arr.Length(); i++) fds.push_back(static_cast<int>(toI64(arr.Get(i), "fd")));
    return PromiseWorker<std::shared_ptr<Handles>>::Run(
        info.Env(),
        [fds] {
          // Imported on a few threads: one import costs about 0.1 ms, and a tier-0 suspend holds
          // every weights region (252 on the 16.74 GiB reference engine). On a failure the
          // handles imported so far are released with `held`.
          auto held = std::make_shared<Handles>(fds.size());
          parallelFor(fds.size(), 8, [&](size_t i) { (*held)[i] = std::make_unique<cuda::HeldHandle>(fds[i]); });
          return held;
        },
        [](Napi::Env env, std::shared_ptr<Handles>& held) { return HeldHandles::wrap(env, held); });
  }, "holdHandles"));
}

}  // namespace vsnap::js
