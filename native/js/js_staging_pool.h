// StagingPool: the pinned host buffers transfers borrow; created once, closed by its owner.
#pragma once

#include <napi.h>

#include <memory>

namespace vsnap::transfer {
class StagingPool;
}

namespace vsnap::js {

class StagingPool : public Napi::ObjectWrap<StagingPool> {
 public:
  static Napi::Function Define(Napi::Env env);
  StagingPool(const Napi::CallbackInfo& info);
  static std::shared_ptr<transfer::StagingPool> unwrap(const Napi::Value& value);

 private:
  Napi::Value SlotSize(const Napi::CallbackInfo& info);
  Napi::Value SlotCount(const Napi::CallbackInfo& info);
  Napi::Value Pinned(const Napi::CallbackInfo& info);
  Napi::Value Closed(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  const std::shared_ptr<transfer::StagingPool>& live(Napi::Env env) const;

  std::shared_ptr<transfer::StagingPool> pool_;
};

}  // namespace vsnap::js
