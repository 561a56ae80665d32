#include "js/js_region_set.h"

#include <fcntl.h>

#include "cuda/vmm_timing.h"
#include "transfer/region_set.h"

namespace vsnap::js {

Napi::Function RegionSet::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, kName,
                                  {InstanceAccessor<&RegionSet::Count>("count"), InstanceAccessor<&RegionSet::Batched>("batched"), InstanceAccessor<&RegionSet::Pipelined>("pipelined"), InstanceMethod<&RegionSet::Settled>("settled"), InstanceAccessor("closed", &RegionSet::Closed, nullptr),
                                   InstanceMethod<&RegionSet::Release>("release"), InstanceMethod("close", &RegionSet::Close)});
  constructor(env) = Napi::Persistent(fn);
  return fn;
}

Napi::Value RegionSet::Count(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->count()));
}

Napi::Value RegionSet::Batched(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), live(info.Env())->batched());
}

Napi::Value RegionSet::Pipelined(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), live(info.Env())->pipelined());
}

// settled(): resolves once every region is mapped (at once unless pipelined); rejects with the
// error that stopped the opening.
Napi::Value RegionSet::Settled(const Napi::CallbackInfo& info) {
  auto set = live(info.Env());
  return PromiseWorker<bool>::Run(
      info.Env(), [set] {
        set->settle();
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); });
}

// release(): drops this handle and unmaps the regions on the thread pool (unmapping thousands of
// regions takes milliseconds the JS thread should not wait for). A running transfer that uses
// some keeps them until it ends. Resolves once this handle's reference is gone.
Napi::Value RegionSet::Release(const Napi::CallbackInfo& info) {
  auto held = std::make_shared<std::shared_ptr<transfer::RegionSet>>(std::move(value_));
  return PromiseWorker<bool>::Run(
      info.Env(), [held] {
        held->reset();
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); });
}

std::shared_ptr<transfer::Region> RegionSet::region(const Napi::Object& spec) {
  Napi::Env env = spec.Env();
  auto set = unwrap(getRequired(spec, "set"));
  uint64_t index = toU64(getRequired(spec, "index"), "memory.index");
  return guard(env, [&] { return set->at(index); });
}

void initRegionSet(Napi::Env env, Napi::Object exports) {
  exports.Set("RegionSet", RegionSet::Define(env));
  exports.Set("openRegions", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "openRegions needs an array of { kind, fd, size }"));
    Napi::Array list = info[0].As<Napi::Array>();
    uint32_t threads = info[1].IsUndefined() ? 0 : static_cast<uint32_t>(toU64(info[1], "threads"));
    transfer::MapMode mode = transfer::MapMode::Auto;
    if (!info[2].IsUndefined()) {
      std::string m = toString(info[2], "mapping");
      if (m == "batched") {
        mode = transfer::MapMode::Batched;
      } else if (m == "per-region") {
        mode = transfer::MapMode::PerRegion;
      } else if (m == "pipelined") {
        mode = transfer::MapMode::Pipelined;
      } else if (m != "auto") {
        throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "mapping must be 'auto', 'batched', 'per-region' or 'pipelined'"));
      }
    }
    auto specs = std::make_shared<std::vector<transfer::RegionSpec>>();
    for (uint32_t i = 0; i < list.Length(); i++) {
      if (!list.Get(i).IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "regions[" + std::to_string(i) + "] must be an object"));
      Napi::Object o = list.Get(i).As<Napi::Object>();
      std::string kind = toString(getRequired(o, "kind"), "kind");
      if (kind != "host" && kind != "imported") throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "kind must be 'host' or 'imported'"));
      transfer::RegionSpec s;
      s.imported = kind == "imported";
      s.size = toU64(getRequired(o, "size"), "size");
      if (o.Has("device") && !o.Get("device").IsUndefined()) s.device = static_cast<int>(toI64(o.Get("device"), "device"));
      int fd = static_cast<int>(toI64(getRequired(o, "fd"), "fd"));
      s.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!s.fd.valid()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "regions[" + std::to_string(i) + "].fd " + std::to_string(fd) + " is not an open descriptor"));
      specs->push_back(std::move(s));
    }
    return PromiseWorker<std::shared_ptr<transfer::RegionSet>>::Run(
        env, [specs, threads, mode] { return transfer::RegionSet::open(std::move(*specs), threads, mode); },
        [](Napi::Env env, std::shared_ptr<transfer::RegionSet>& set) { return RegionSet::wrap(env, set); });
  }, "openRegions"));
  exports.Set("regionCounters", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    auto c = transfer::regionCounters();
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("hostMaps", static_cast<double>(c.hostMaps));
    out.Set("imports", static_cast<double>(c.imports));
    return out;
  }, "regionCounters"));
  // vmmTimings(): per step of opening and closing region sets, the process-wide totals of calls,
  // regions covered and seconds (cuda/vmm_timing.h); a bench takes the difference around a run.
  exports.Set("vmmTimings", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    auto totals = cuda::vmmTotals();
    Napi::Object out = Napi::Object::New(info.Env());
    for (size_t i = 0; i < totals.size(); i++) {
      Napi::Object step = Napi::Object::New(info.Env());
      step.Set("calls", static_cast<double>(totals[i].calls));
      step.Set("items", static_cast<double>(totals[i].items));
      step.Set("seconds", static_cast<double>(totals[i].ns) / 1e9);
      out.Set(cuda::vmmStepName(static_cast<cuda::VmmStep>(i)), step);
    }
    return out;
  }, "vmmTimings"));
}

}  // namespace vsnap::js
