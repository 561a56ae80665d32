// checkpointState/Lock/Checkpoint/Restore(pid, pairs?)/Unlock(pid): the driver's process checkpoint API,
// each call on the libuv pool (a checkpoint of a few GiB takes seconds), settling a promise.
#include "cuda/checkpoint.h"
#include "js/js_util.h"

#include <vector>

namespace vsnap::js {
namespace {

int pidArg(const Napi::CallbackInfo& info) {
  int64_t pid = toI64(info[0], "pid");
  if (pid <= 0 || pid > 0x7fffffff) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "pid must be a positive process id"));
  return static_cast<int>(pid);
}

Napi::Value Undefined(Napi::Env env, bool&) { return env.Undefined(); }

template <typename Fn>
Napi::Value runVoid(Napi::Env env, Fn fn) {
  return PromiseWorker<bool>::Run(
      env, [fn] { fn(); return true; }, Undefined);
}

Napi::Value State(const Napi::CallbackInfo& info) {
  int pid = pidArg(info);
  return PromiseWorker<std::string>::Run(
      info.Env(), [pid] { return cuda::checkpoint::state(pid); },
      [](Napi::Env env, std::string& s) -> Napi::Value { return Napi::String::New(env, s); });
}

Napi::Value Lock(const Napi::CallbackInfo& info) {
  int pid = pidArg(info);
  uint64_t timeoutMs = info.Length() > 1 && !info[1].IsUndefined() ? toU64(info[1], "timeoutMs") : 0;
  if (timeoutMs > 0xffffffffull) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "timeoutMs is out of range"));
  return runVoid(info.Env(), [pid, timeoutMs] { cuda::checkpoint::lock(pid, static_cast<unsigned>(timeoutMs)); });
}

Napi::Value Checkpoint(const Napi::CallbackInfo& info) {
  int pid = pidArg(info);
  return runVoid(info.Env(), [pid] { cuda::checkpoint::checkpoint(pid); });
}

// restore(pid, pairs?): pairs an array of { oldUuid, newUuid } strings (remap onto other GPUs).
Napi::Value Restore(const Napi::CallbackInfo& info) {
  int pid = pidArg(info);
  std::vector<cuda::checkpoint::GpuPair> pairs;
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    if (!info[1].IsArray()) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "pairs must be an array of { oldUuid, newUuid }"));
    Napi::Array list = info[1].As<Napi::Array>();
    for (uint32_t i = 0; i < list.Length(); i++) {
      Napi::Value item = list.Get(i);
      if (!item.IsObject()) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "each pair must be an object { oldUuid, newUuid }"));
      Napi::Object pair = item.As<Napi::Object>();
      pairs.push_back({toString(getRequired(pair, "oldUuid"), "oldUuid"), toString(getRequired(pair, "newUuid"), "newUuid")});
    }
  }
  return runVoid(info.Env(), [pid, pairs] { cuda::checkpoint::restore(pid, pairs); });
}

Napi::Value Unlock(const Napi::CallbackInfo& info) {
  int pid = pidArg(info);
  return runVoid(info.Env(), [pid] { cuda::checkpoint::unlock(pid); });
}

}  // namespace

void initCheckpoint(Napi::Env env, Napi::Object exports) {
  exports.Set("checkpointState", Napi::Function::New(env, State, "checkpointState"));
  exports.Set("checkpointLock", Napi::Function::New(env, Lock, "checkpointLock"));
  exports.Set("checkpointCheckpoint", Napi::Function::New(env, Checkpoint, "checkpointCheckpoint"));
  exports.Set("checkpointRestore", Napi::Function::New(env, Restore, "checkpointRestore"));
  exports.Set("checkpointUnlock", Napi::Function::New(env, Unlock, "checkpointUnlock"));
}

}  // namespace vsnap::js
