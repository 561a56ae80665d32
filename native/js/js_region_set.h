// RegionSet: regions opened once for several operations of one engine flow (see
// transfer/region_set.h). openRegions(specs, threads, mapping?) -> Promise<RegionSet>; set.release()
// unmaps off the JS thread; close() drops the handle at once.
#pragma once

#include "js/shared_wrap.h"

namespace vsnap::transfer {
class RegionSet;
class Region;
}

namespace vsnap::js {

class RegionSet : public SharedWrap<RegionSet, transfer::RegionSet> {
 public:
  static constexpr const char* kName = "RegionSet";
  static Napi::FunctionReference& constructor(Napi::Env env) { return addonData(env).regionSet; }
  static Napi::Function Define(Napi::Env env);
  using SharedWrap::SharedWrap;

  // The region of a `{ kind: 'mapped', set, index }` memory spec.
  static std::shared_ptr<transfer::Region> region(const Napi::Object& spec);

 private:
  Napi::Value Count(const Napi::CallbackInfo& info);
  Napi::Value Batched(const Napi::CallbackInfo& info);
  Napi::Value Pipelined(const Napi::CallbackInfo& info);
  Napi::Value Settled(const Napi::CallbackInfo& info);
  Napi::Value Release(const Napi::CallbackInfo& info);
};

}  // namespace vsnap::js
