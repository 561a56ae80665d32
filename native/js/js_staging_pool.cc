#include "js/js_staging_pool.h"

#include "transfer/staging_pool.h"

namespace vsnap::js {

Napi::Function StagingPool::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, kName,
                                  {InstanceAccessor<&StagingPool::SlotSize>("slotSize"),
                                   InstanceAccessor<&StagingPool::SlotCount>("slotCount"),
                                   InstanceAccessor<&StagingPool::Pinned>("pinned"),
                                   InstanceAccessor<&StagingPool::FreeSlots>("freeSlots"),
                                   InstanceAccessor("closed", &StagingPool::Closed, nullptr),
                                   InstanceMethod("close", &StagingPool::Close)});
  constructor(env) = Napi::Persistent(fn);
  return fn;
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

Napi::Value StagingPool::FreeSlots(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), live(info.Env())->freeSlots());
}

void initStagingPool(Napi::Env env, Napi::Object exports) {
  exports.Set("StagingPool", StagingPool::Define(env));
  exports.Set("createStagingPool", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    uint64_t slotSize = toU64(info[0], "slotSize");
    uint32_t slotCount = static_cast<uint32_t>(toU64(info[1], "slotCount"));
    int pinDevice = static_cast<int>(toI64(info[2], "pinDevice"));
    return PromiseWorker<std::shared_ptr<transfer::StagingPool>>::Run(
        info.Env(), [=] { return std::make_shared<transfer::StagingPool>(slotSize, slotCount, pinDevice); },
        [](Napi::Env env, std::shared_ptr<transfer::StagingPool>& pool) { return StagingPool::wrap(env, pool); });
  }, "createStagingPool"));
}

}  // namespace vsnap::js
