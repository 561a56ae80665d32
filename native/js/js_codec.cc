// The vsnap-c1 chunk codec (native/codec): codecEncode(data, kind) and codecDecode(coded,
// rawSize) on the CPU (synchronous; codecEncodeAsync and codecDecodeAsync off the JS thread), codecParse(coded, rawSize) -> header fields, and through
// a GPU (promises, off the JS thread): codecEncodeDevice, codecDecodeDevice; the RAM tier's coded
// restore (codecRestoreHeld) and coded capture (codecCaptureHeld).
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_gpu.h"
#include "codec/codec_capture.h"
#include "codec/codec_restore.h"
#include "js/js_memory.h"
#include "transfer/host_buffer.h"
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

// The same two off the JS thread (the libuv pool), for the SDK's flows: a 64 MiB chunk takes the
// CPU codec 0.1-0.5 s, which a service's event loop must not wait out. The input is referenced,
// not copied, until the work ends; its bytes must not change meanwhile.
Napi::Value CodecEncodeAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto data = bytesArg(info, 0, "data");
  uint32_t kind = kindArg(info, 1);
  const uint8_t* bytes = data.Data();
  size_t length = data.ByteLength();
  return PromiseWorker<std::vector<uint8_t>>::Run(
      env, [=] { return codec::encode(bytes, length, kind); },
      [](Napi::Env env, std::vector<uint8_t>& coded) { return toBuffer(env, coded); }, {data});
}

Napi::Value CodecDecodeAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto coded = bytesArg(info, 0, "coded");
  uint64_t rawSize = toU64(info[1], "rawSize");
  guard(env, [&] { return codec::parse(coded.Data(), coded.ByteLength(), rawSize); });  // before any memory is made
  const uint8_t* bytes = coded.Data();
  size_t length = coded.ByteLength();
  return PromiseWorker<std::vector<uint8_t>>::Run(
      env,
      [=] {
        std::vector<uint8_t> out(rawSize);
        codec::decode(bytes, length, out.data(), rawSize);
        return out;
      },
      [](Napi::Env env, std::vector<uint8_t>& raw) { return toBuffer(env, raw); }, {coded});
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

// codecRestoreHeld({ kind: 'buffer', buffer }, [{ memory, size, chunks: Float64Array of
// (at, held, rawSize, dstOffset, coded) per chunk }]) -> { seconds, rawBytes, linkBytes, scratchBytes }
Napi::Value CodecRestoreHeld(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto source = std::make_shared<MemorySpec>(parseMemory(env, info[0]));
  if (source->kind != MemorySpec::Kind::Buffer) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "the source must be a HostBuffer"));
  if (!info[1].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "targets must be an array"));
  Napi::Array list = info[1].As<Napi::Array>();
  struct Spec {
    std::shared_ptr<MemorySpec> memory;
    uint64_t size;
    std::vector<codec::HeldChunk> chunks;
  };
  auto specs = std::make_shared<std::vector<Spec>>();
  const uint64_t limit = source->buffer->size();
  for (uint32_t i = 0; i < list.Length(); i++) {
    Napi::Value v = list.Get(i);
    if (!v.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "targets[" + std::to_string(i) + "] must be an object"));
    Napi::Object o = v.As<Napi::Object>();
    Spec spec{std::make_shared<MemorySpec>(parseMemory(env, getRequired(o, "memory"))), toU64(getRequired(o, "size"), "size"), {}};
    Napi::Value c = getRequired(o, "chunks");
    if (!c.IsTypedArray() || c.As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "chunks must be a Float64Array"));
    }
    auto f = c.As<Napi::Float64Array>();
    if (f.ElementLength() % 5) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "chunks holds 5 numbers a chunk"));
    for (size_t k = 0; k < f.ElementLength(); k += 5) {
      codec::HeldChunk h{static_cast<uint64_t>(f[k]), static_cast<uint64_t>(f[k + 1]), static_cast<uint64_t>(f[k + 2]), static_cast<uint64_t>(f[k + 3]), f[k + 4] != 0};
      if (h.at > limit || h.held > limit - h.at) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "a chunk lies outside the HostBuffer"));
      spec.chunks.push_back(h);
    }
    specs->push_back(std::move(spec));
  }
  return PromiseWorker<codec::HeldRestoreResult>::Run(
      env,
      [source, specs] {
        std::vector<codec::HeldTarget> targets;
        for (auto& s : *specs) targets.push_back({s.memory->open(s.size), s.chunks});
        return codec::restoreHeld(source->buffer->data(), targets);
      },
      [](Napi::Env env, codec::HeldRestoreResult& r) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("seconds", r.seconds);
        o.Set("rawBytes", static_cast<double>(r.rawBytes));
        o.Set("linkBytes", static_cast<double>(r.linkBytes));
        o.Set("scratchBytes", static_cast<double>(r.scratchBytes));
        return o;
      },
      {info[0]});
}

// codecCaptureHeld({ kind: 'buffer', buffer, offset }, limit, [{ memory, size, chunkSize, kind }])
// -> { seconds, rawBytes, linkBytes, scratchBytes, end, chunks: [Float64Array of (at, held, rawSize,
// coded) per chunk] per source }: the sources' chunks coded on their GPU into the HostBuffer from
// offset, never past limit.
Napi::Value CodecCaptureHeld(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto dest = std::make_shared<MemorySpec>(parseMemory(env, info[0]));
  if (dest->kind != MemorySpec::Kind::Buffer) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "the destination must be a HostBuffer"));
  const uint64_t limit = toU64(info[1], "limit");
  if (limit > dest->buffer->size() || dest->offset > limit) {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "offset and limit must lie inside the HostBuffer, offset first"));
  }
  if (!info[2].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "sources must be an array"));
  Napi::Array list = info[2].As<Napi::Array>();
  struct Spec {
    std::shared_ptr<MemorySpec> memory;
    uint64_t size, chunkSize;
    uint32_t kind;
  };
  auto specs = std::make_shared<std::vector<Spec>>();
  for (uint32_t i = 0; i < list.Length(); i++) {
    Napi::Value v = list.Get(i);
    if (!v.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "sources[" + std::to_string(i) + "] must be an object"));
    Napi::Object o = v.As<Napi::Object>();
    uint64_t kind = toU64(getRequired(o, "kind"), "kind");
    if (kind > vsnap_c1::kE5m2) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "kind must be 0..6, not " + std::to_string(kind)));
    specs->push_back({std::make_shared<MemorySpec>(parseMemory(env, getRequired(o, "memory"))), toU64(getRequired(o, "size"), "size"),
                      toU64(getRequired(o, "chunkSize"), "chunkSize"), static_cast<uint32_t>(kind)});
  }
  return PromiseWorker<codec::CaptureHeldResult>::Run(
      env,
      [dest, specs, limit] {
        std::vector<codec::CaptureSource> sources;
        for (auto& s : *specs) sources.push_back({s.memory->open(s.size), s.chunkSize, s.kind});
        return codec::captureHeld(dest->buffer->data(), dest->offset, limit, sources);
      },
      [](Napi::Env env, codec::CaptureHeldResult& r) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("seconds", r.seconds);
        o.Set("rawBytes", static_cast<double>(r.rawBytes));
        o.Set("linkBytes", static_cast<double>(r.linkBytes));
        o.Set("scratchBytes", static_cast<double>(r.scratchBytes));
        o.Set("end", static_cast<double>(r.end));
        Napi::Array chunks = Napi::Array::New(env, r.chunks.size());
        for (size_t t = 0; t < r.chunks.size(); t++) {
          auto f = Napi::Float64Array::New(env, 4 * r.chunks[t].size());
          for (size_t k = 0; k < r.chunks[t].size(); k++) {
            const auto& c = r.chunks[t][k];
            f[4 * k] = static_cast<double>(c.at);
            f[4 * k + 1] = static_cast<double>(c.held);
            f[4 * k + 2] = static_cast<double>(c.rawSize);
            f[4 * k + 3] = c.coded ? 1 : 0;
          }
          chunks.Set(static_cast<uint32_t>(t), f);
        }
        o.Set("chunks", chunks);
        return o;
      },
      {info[0]});
}

}  // namespace

void initCodec(Napi::Env env, Napi::Object exports) {
  exports.Set("codecEncode", Napi::Function::New(env, CodecEncode, "codecEncode"));
  exports.Set("codecDecode", Napi::Function::New(env, CodecDecode, "codecDecode"));
  exports.Set("codecEncodeAsync", Napi::Function::New(env, CodecEncodeAsync, "codecEncodeAsync"));
  exports.Set("codecDecodeAsync", Napi::Function::New(env, CodecDecodeAsync, "codecDecodeAsync"));
  exports.Set("codecParse", Napi::Function::New(env, CodecParse, "codecParse"));
  exports.Set("codecEncodeDevice", Napi::Function::New(env, CodecEncodeDevice, "codecEncodeDevice"));
  exports.Set("codecDecodeDevice", Napi::Function::New(env, CodecDecodeDevice, "codecDecodeDevice"));
  exports.Set("codecCaptureHeld", Napi::Function::New(env, CodecCaptureHeld, "codecCaptureHeld"));
  exports.Set("codecRestoreHeld", Napi::Function::New(env, CodecRestoreHeld, "codecRestoreHeld"));
}

}  // namespace vsnap::js
