// The vsnap-c1 chunk codec (native/codec): codecEncode(data, kind) and codecDecode(coded,
// rawSize) on the CPU (synchronous), codecParse(coded, rawSize) -> header fields, and through
// a GPU (promises, off the JS thread): codecEncodeDevice, codecDecodeDevice, codecBenchDevice.
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_gpu.h"
#include "js/js_util.h"

namespace vsnap::js {
namespace {

Napi::Uint8Array bytesArg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (!info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", std::string(what) + " must be a Buffer or Uint8Array"));
  }
  return info[i].As<Napi::Uint8Array>();
}

uint32_t kindArg(const Napi::CallbackInfo& info, size_t i) {
  uint64_t k = toU64(info[i], "kind");
  if (k > vsnap_c1::kE5m2) throw toJsError(info.Env(), NativeError("E_INVALID_ARGUMENT", "kind must be 0..6, not " + std::to_string(k)));
  return static_cast<uint32_t>(k);
}

Napi::Buffer<uint8_t> toBuffer(Napi::Env env, std::vector<uint8_t>& bytes) {
  return Napi::Buffer<uint8_t>::Copy(env, bytes.data(), bytes.size());
}

Napi::Value CodecEncode(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto data = bytesArg(info, 0, "data");
  uint32_t kind = kindArg(info, 1);
  auto coded = guard(env, [&] { return codec::encode(data.Data(), data.ByteLength(), kind); });
  return toBuffer(env, coded);
}

Napi::Value CodecDecode(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto coded = bytesArg(info, 0, "coded");
  uint64_t rawSize = toU64(info[1], "rawSize");
  // the header is checked before the output is made, so a damaged size cannot ask for memory
  guard(env, [&] { return codec::parse(coded.Data(), coded.ByteLength(), rawSize); });
  auto out = Napi::Buffer<uint8_t>::New(env, rawSize);
  guard(env, [&] { codec::decode(coded.Data(), coded.ByteLength(), out.Data(), rawSize); });
  return out;
}

Napi::Value CodecParse(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto coded = bytesArg(info, 0, "coded");
  uint64_t rawSize = toU64(info[1], "rawSize");
  auto h = guard(env, [&] { return codec::parse(coded.Data(), coded.ByteLength(), rawSize); });
  Napi::Object o = Napi::Object::New(env);
  o.Set("mode", h.mode);
  o.Set("kind", h.kind);
  o.Set("width", h.width);
  o.Set("rawSize", static_cast<double>(h.rawSize));
  o.Set("codedSize", static_cast<double>(h.codedSize));
  o.Set("blockCount", h.blockCount);
  o.Set("exceptionCount", static_cast<double>(h.exceptionCount));
  return o;
}

Napi::Value deviceResult(Napi::Env env, codec::DeviceResult& r, const char* key) {
  Napi::Object o = Napi::Object::New(env);
  o.Set(key, toBuffer(env, r.bytes));
  o.Set("kernelMs", r.kernelMs);
  return o;
}

Napi::Value CodecEncodeDevice(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto data = bytesArg(info, 0, "data");
  uint32_t kind = kindArg(info, 1);
  int device = static_cast<int>(toI64(info[2], "device"));
  auto copy = std::make_shared<std::vector<uint8_t>>(data.Data(), data.Data() + data.ByteLength());
  return PromiseWorker<codec::DeviceResult>::Run(
      env, [=] { return codec::encodeThroughDevice(device, copy->data(), copy->size(), kind); },
      [](Napi::Env env, codec::DeviceResult& r) { return deviceResult(env, r, "coded"); });
}

Napi::Value CodecDecodeDevice(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto coded = bytesArg(info, 0, "coded");
  uint64_t rawSize = toU64(info[1], "rawSize");
  int device = static_cast<int>(toI64(info[2], "device"));
  auto copy = std::make_shared<std::vector<uint8_t>>(coded.Data(), coded.Data() + coded.ByteLength());
  return PromiseWorker<codec::DeviceResult>::Run(
      env, [=] { return codec::decodeThroughDevice(device, copy->data(), copy->size(), rawSize); },
      [](Napi::Env env, codec::DeviceResult& r) { return deviceResult(env, r, "data"); });
}

Napi::Value CodecBenchDevice(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto data = bytesArg(info, 0, "data");
  uint32_t kind = kindArg(info, 1);
  int device = static_cast<int>(toI64(info[2], "device"));
  int repeats = static_cast<int>(toU64(info[3], "repeats"));
  auto copy = std::make_shared<std::vector<uint8_t>>(data.Data(), data.Data() + data.ByteLength());
  return PromiseWorker<codec::BenchResult>::Run(
      env, [=] { return codec::benchDevice(device, copy->data(), copy->size(), kind, repeats); },
      [](Napi::Env env, codec::BenchResult& b) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("rawSize", static_cast<double>(b.rawSize));
        o.Set("codedSize", static_cast<double>(b.codedSize));
        o.Set("mode", b.mode);
        o.Set("kind", b.kind);
        o.Set("width", b.width);
        auto list = [&](const std::vector<float>& v) {
          Napi::Array a = Napi::Array::New(env, v.size());
          for (size_t i = 0; i < v.size(); i++) a.Set(i, v[i]);
          return a;
        };
        o.Set("encodeMs", list(b.encodeMs));
        o.Set("decodeMs", list(b.decodeMs));
        o.Set("copyMs", list(b.copyMs));
        o.Set("sameAsCpu", b.sameAsCpu);
        o.Set("roundTrip", b.roundTrip);
        return o;
      });
}

}  // namespace

void initCodec(Napi::Env env, Napi::Object exports) {
  exports.Set("codecEncode", Napi::Function::New(env, CodecEncode, "codecEncode"));
  exports.Set("codecDecode", Napi::Function::New(env, CodecDecode, "codecDecode"));
  exports.Set("codecParse", Napi::Function::New(env, CodecParse, "codecParse"));
  exports.Set("codecEncodeDevice", Napi::Function::New(env, CodecEncodeDevice, "codecEncodeDevice"));
  exports.Set("codecDecodeDevice", Napi::Function::New(env, CodecDecodeDevice, "codecDecodeDevice"));
  exports.Set("codecBenchDevice", Napi::Function::New(env, CodecBenchDevice, "codecBenchDevice"));
}

}  // namespace vsnap::js
