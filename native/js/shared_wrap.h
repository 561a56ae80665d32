// SharedWrap: the one pattern behind the addon's resource classes (DeviceAllocation,
// StagingPool, HostBuffer). A JS object holds a shared_ptr to the native resource; running
// transfers hold their own copies, so close() drops this handle and the resource is freed when
// the last user lets go. Objects are made by the factories (wrap()), never with `new` from JS.
#pragma once

#include <napi.h>

#include <memory>
#include <string>

#include "js/js_util.h"

namespace vsnap::js {

// Derived provides: static constexpr const char* kName; and
// static Napi::FunctionReference& constructor(Napi::Env).
template <typename Derived, typename T>
class SharedWrap : public Napi::ObjectWrap<Derived> {
 public:
  explicit SharedWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Derived>(info) {
    if (info.Length() != 1 || !info[0].IsExternal()) {
      throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", std::string(Derived::kName) +
                                                                        " objects come from vsnap's factories, not from new"));
    }
    value_ = *info[0].As<Napi::External<std::shared_ptr<T>>>().Data();
    lifecycle_ = addonData(info.Env()).lifecycle;
    lifecycle_->add(this, [this] { value_.reset(); });  // released when the environment goes
  }

  ~SharedWrap() override { lifecycle_->remove(this); }

  // A new JS object holding `value`.
  static Napi::Value wrap(Napi::Env env, std::shared_ptr<T> value) {
    return Derived::constructor(env).New({Napi::External<std::shared_ptr<T>>::New(env, &value)});
  }

  // The resource behind a JS object of this class (throws when it is not one, or is closed).
  static std::shared_ptr<T> unwrap(const Napi::Value& value) {
    Napi::Env env = value.Env();
    if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(Derived::constructor(env).Value())) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", std::string("expected a ") + Derived::kName));
    }
    return Napi::ObjectWrap<Derived>::Unwrap(value.As<Napi::Object>())->live(env);
  }

 protected:
  const std::shared_ptr<T>& live(Napi::Env env) const {
    if (!value_) throw toJsError(env, NativeError("E_CLOSED", std::string("this ") + Derived::kName + " was closed"));
    return value_;
  }
  Napi::Value Closed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), !value_); }
  Napi::Value Close(const Napi::CallbackInfo& info) {
    value_.reset();
    return info.Env().Undefined();
  }

  std::shared_ptr<T> value_;
  std::shared_ptr<Lifecycle> lifecycle_;
};

}  // namespace vsnap::js
