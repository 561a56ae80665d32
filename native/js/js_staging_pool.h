// StagingPool: the pinned host buffers transfers borrow; created once, closed by its owner.
#pragma once

#include "js/shared_wrap.h"

namespace vsnap::transfer {
class StagingPool;
}

namespace vsnap::js {

class StagingPool : public SharedWrap<StagingPool, transfer::StagingPool> {
 public:
  static constexpr const char* kName = "StagingPool";
  static Napi::FunctionReference& constructor(Napi::Env env) { return addonData(env).stagingPool; }
  static Napi::Function Define(Napi::Env env);
  using SharedWrap::SharedWrap;

 private:
  Napi::Value SlotSize(const Napi::CallbackInfo& info);
  Napi::Value SlotCount(const Napi::CallbackInfo& info);
  Napi::Value Pinned(const Napi::CallbackInfo& info);
  Napi::Value FreeSlots(const Napi::CallbackInfo& info);
};

}  // namespace vsnap::js
