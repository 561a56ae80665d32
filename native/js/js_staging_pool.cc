#include "js/js_staging_pool.h"

#include "js/js_util.h"
#include "transfer/staging_pool.h"

namespace vsnap::js {

Napi::Function StagingPool::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, "StagingPool",
                                  {InstanceAccessor<&StagingPool::SlotSize>("slotSize"),
                                   InstanceAccessor<&StagingPool::SlotCount>("slotCount"),
                                   InstanceAccessor<&StagingPool::Pinned>("pinned"),
                                   InstanceAccessor<&StagingPool::Closed>("closed"),
                                   InstanceMethod<&StagingPool::Close>("close")});
  addonData(env).stagingPool = Napi::Persistent(fn);
  return fn;
}

StagingPool::StagingPool(const Napi::CallbackInfo& info) : Napi::ObjectWrap<StagingPool>(info) {
  if (info.Length() != 1 || !info[0].IsExternal()) {
    throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "use createStagingPool() to create a StagingPool"));
  }
  pool_ = *info[0].As<Napi::External<std::shared_ptr<transfer::StagingPool>>>().Data();
}

std::shared_ptr<transfer::StagingPool> StagingPool::unwrap(const Napi::Value& value) {
  Napi::Env env = value.Env();
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(addonData(env).stagingPool.Value())) {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "expected a StagingPool"));
  }
  return Unwrap(value.As<Napi::Object>())->live(env);
}

const std::shared_ptr<transfer::StagingPool>& StagingPool::live(Napi::Env env) const {
  if (!pool_) throw toJsError(env, NativeError("E_CLOSED", "this StagingPool was closed"));
  return pool_;
}

Napi::Value StagingPool::SlotSize(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->slotSize()));
}
Napi::Value StagingPool::SlotCount(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), live(info.Env())->slotCount());
}
Napi::Value StagingPool::Pinned(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), live(info.Env())->pinned());
}
Napi::Value StagingPool::Closed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), !pool_); }

// Drops this handle; the memory is unpinned and freed once running transfers return it.
Napi::Value StagingPool::Close(const Napi::CallbackInfo& info) {
  pool_.reset();
  return info.Env().Undefined();
}

void initStagingPool(Napi::Env env, Napi::Object exports) {
  exports.Set("StagingPool", StagingPool::Define(env));
  exports.Set("createStagingPool", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    uint64_t slotSize = toU64(info[0], "slotSize");
    uint32_t slotCount = static_cast<uint32_t>(toU64(info[1], "slotCount"));
    int pinDevice = static_cast<int>(toI64(info[2], "pinDevice"));
    return PromiseWorker<std::shared_ptr<transfer::StagingPool>>::Run(
        info.Env(),
        [=] { return std::make_shared<transfer::StagingPool>(slotSize, slotCount, pinDevice); },
        [](Napi::Env env, std::shared_ptr<transfer::StagingPool>& pool) -> Napi::Value {
          std::shared_ptr<transfer::StagingPool> holder = pool;
          return addonData(env).stagingPool.New({Napi::External<std::shared_ptr<transfer::StagingPool>>::New(env, &holder)});
        });
  }, "createStagingPool"));
}

}  // namespace vsnap::js
