#include "js/js_util.h"

#include <cmath>

#include "common/fault.h"

namespace vsnap::js {

AddonData& addonData(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }

Napi::Error toJsError(Napi::Env env, const NativeError& error) {
  Napi::Error err = Napi::Error::New(env, error.what());
  err.Set("code", Napi::String::New(env, error.code()));
  Napi::Object details = Napi::Object::New(env);
  for (const auto& [key, value] : error.details()) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            details.Set(key, Napi::String::New(env, v));
          } else if constexpr (std::is_same_v<T, bool>) {
            details.Set(key, Napi::Boolean::New(env, v));
          } else {
            details.Set(key, Napi::Number::New(env, static_cast<double>(v)));
          }
        },
        value);
  }
  err.Set("details", details);
  return err;
}

uint64_t toU64(const Napi::Value& value, const char* what) {
  if (value.IsBigInt()) {
    bool lossless = true;
    uint64_t v = value.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless) throw toJsError(value.Env(), NativeError("E_INVALID_ARGUMENT", std::string(what) + " is out of range"));
    return v;
  }
  if (value.IsNumber()) {
    double d = value.As<Napi::Number>().DoubleValue();
    if (d >= 0 && d <= 9007199254740991.0 && std::floor(d) == d) return static_cast<uint64_t>(d);
  }
  throw toJsError(value.Env(), NativeError("E_INVALID_ARGUMENT", std::string(what) + " must be a non-negative integer"));
}

int64_t toI64(const Napi::Value& value, const char* what) {
  if (value.IsNumber()) {
    double d = value.As<Napi::Number>().DoubleValue();
    if (std::fabs(d) <= 9007199254740991.0 && std::floor(d) == d) return static_cast<int64_t>(d);
  }
  throw toJsError(value.Env(), NativeError("E_INVALID_ARGUMENT", std::string(what) + " must be an integer"));
}

std::string toString(const Napi::Value& value, const char* what) {
  if (!value.IsString()) throw toJsError(value.Env(), NativeError("E_INVALID_ARGUMENT", std::string(what) + " must be a string"));
  return value.As<Napi::String>().Utf8Value();
}

Napi::Value getRequired(const Napi::Object& object, const char* key) {
  Napi::Value v = object.Get(key);
  if (v.IsUndefined()) throw toJsError(object.Env(), NativeError("E_INVALID_ARGUMENT", std::string("missing option '") + key + "'"));
  return v;
}

Napi::Value SetFault(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = toString(info[0], "point");
  auto point = guard(env, [&] { return fault::parse(name); });
  uint32_t times = static_cast<uint32_t>(toU64(info[1], "times"));
  uint32_t arg = info.Length() > 2 && !info[2].IsUndefined() ? static_cast<uint32_t>(toU64(info[2], "arg")) : 0;
  fault::set(point, times, arg);
  return env.Undefined();
}

}  // namespace vsnap::js
