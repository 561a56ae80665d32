// Glue shared by the JavaScript bindings: NativeError -> JS Error with code/details, argument
// readers, and PromiseWorker, the one way the addon runs work off the JS thread for a promise.
#pragma once

#include <napi.h>

#include <cxxabi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "js/js_lifecycle.h"

namespace vsnap::js {

Napi::Error toJsError(Napi::Env env, const NativeError& error);

// Throws a JS TypeError-like E_INVALID_ARGUMENT when value is not what is expected.
uint64_t toU64(const Napi::Value& value, const char* what);
int64_t toI64(const Napi::Value& value, const char* what);
std::string toString(const Napi::Value& value, const char* what);
Napi::Value getRequired(const Napi::Object& object, const char* key);

// Describes the exception in flight that is not a std::exception (its type's name, if known).
inline std::string unknownException() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  return std::string("a native exception of type ") + (type ? type->name() : "unknown") +
         " escaped; please report it with the operation that failed";
}

// Runs fn, returning the NativeError it threw (E_INTERNAL, naming what was thrown, for any
// other exception), if any. Nothing escapes: an exception off the JS thread would terminate.
template <typename Fn>
std::optional<NativeError> captureError(Fn&& fn) {
  try {
    fn();
    return std::nullopt;
  } catch (const NativeError& e) {
    return e;
  } catch (const std::exception& e) {
    return NativeError("E_INTERNAL", e.what());
  } catch (...) {
    return NativeError("E_INTERNAL", unknownException());
  }
}

// Per-environment state (constructors of the wrapped classes), so worker threads each get theirs.
struct AddonData {
  Napi::FunctionReference deviceAllocation;
  Napi::FunctionReference stagingPool;
  Napi::FunctionReference hostBuffer;
  Napi::FunctionReference heldHandles;
  Napi::FunctionReference regionSet;
  // Shared with every object that registers in it, so teardown order does not matter.
  std::shared_ptr<Lifecycle> lifecycle = std::make_shared<Lifecycle>();
};
AddonData& addonData(Napi::Env env);

// Runs work() on the libuv thread pool and settles a promise with convert(result). A
// NativeError rejects with the corresponding JS error. keepAlive values (buffers the work
// reads or writes, wrapped objects it uses) are referenced until the work ends.
template <typename Result>
class PromiseWorker : public Napi::AsyncWorker {
 public:
  using Work = std::function<Result()>;
  using Convert = std::function<Napi::Value(Napi::Env, Result&)>;

  static Napi::Promise Run(Napi::Env env, Work work, Convert convert, std::vector<Napi::Value> keepAlive = {}) {
    auto* worker = new PromiseWorker(env, std::move(work), std::move(convert), keepAlive);
    Napi::Promise promise = worker->deferred_.Promise();
    worker->Queue();
    return promise;
  }

 protected:
  void Execute() override {
    error_ = captureError([this] { result_ = work_(); });
    if (error_) SetError(error_->what());
  }
  void OnOK() override {
    Napi::HandleScope scope(Env());
    try {
      deferred_.Resolve(convert_(Env(), *result_));
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error&) override {
    Napi::HandleScope scope(Env());
    deferred_.Reject(toJsError(Env(), *error_).Value());
  }
  void OnWorkComplete(Napi::Env env, napi_status status) override {
    if (lifecycle_->stopping()) {  // the environment is going away: no JS left to settle in
      Destroy();
      return;
    }
    Napi::AsyncWorker::OnWorkComplete(env, status);
  }

 private:
  PromiseWorker(Napi::Env env, Work work, Convert convert, const std::vector<Napi::Value>& keepAlive)
      : Napi::AsyncWorker(env, "vsnap"), deferred_(Napi::Promise::Deferred::New(env)),
        work_(std::move(work)), convert_(std::move(convert)), lifecycle_(addonData(env).lifecycle) {
    for (const auto& v : keepAlive) keepAlive_.push_back(Napi::Persistent(v));
  }

  Napi::Promise::Deferred deferred_;
  Work work_;
  Convert convert_;
  std::vector<Napi::Reference<Napi::Value>> keepAlive_;
  std::optional<Result> result_;
  std::optional<NativeError> error_;
  std::shared_ptr<Lifecycle> lifecycle_;
};

// Calls fn, turning a NativeError into a thrown JS error (for synchronous bindings).
template <typename Fn>
auto guard(Napi::Env env, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const NativeError& e) {
    throw toJsError(env, e);
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw toJsError(env, NativeError("E_INTERNAL", e.what()));
  } catch (...) {
    throw toJsError(env, NativeError("E_INTERNAL", unknownException()));
  }
}


// Module pieces, one per binding file; each adds its exports.
void initCuda(Napi::Env env, Napi::Object exports);
void initAllocation(Napi::Env env, Napi::Object exports);
void initStagingPool(Napi::Env env, Napi::Object exports);
void initHostBuffer(Napi::Env env, Napi::Object exports);
void initHeldHandles(Napi::Env env, Napi::Object exports);
void initTransfer(Napi::Env env, Napi::Object exports);
void initFdListener(Napi::Env env, Napi::Object exports);
void initFiles(Napi::Env env, Napi::Object exports);
void initDigest(Napi::Env env, Napi::Object exports);
void initCodec(Napi::Env env, Napi::Object exports);  // js_codec.cc
void initCheckpoint(Napi::Env env, Napi::Object exports);
void initPeer(Napi::Env env, Napi::Object exports);       // js_peer.cc
void initMultipath(Napi::Env env, Napi::Object exports);  // js_multipath.cc
void initRegionSet(Napi::Env env, Napi::Object exports);
void initCopyQueue(Napi::Env env, Napi::Object exports);  // js_copy_queue.cc

// setFault(point, times, arg?): arms a test fault (common/fault.h). For tests only.
Napi::Value SetFault(const Napi::CallbackInfo& info);

}  // namespace vsnap::js
