// Copies between GPUs: canAccessPeer(device, peer) -> boolean, and
// peerCopy({ device, pairs: [{ src: Memory, dst: Memory, size }], repeats? }) ->
// Promise<{ bytes, seconds, copySeconds: number[] }>: each pair copied on one stream of `device`
// (which is granted access to both sides), waited for once per repeat.
// Memory: { kind: 'device', allocation } | { kind: 'imported', fd }.
#include <fcntl.h>

#include <chrono>

#include "common/fd.h"
#include "cuda/context.h"
#include "cuda/peer.h"
#include "cuda/vmm.h"
#include "js/js_allocation.h"
#include "js/js_util.h"

namespace vsnap::js {
namespace {

struct Side {
  std::shared_ptr<cuda::Mapping> mapping;
  UniqueFd fd;
};

struct Pair {
  Side src, dst;
  uint64_t size = 0;
};

struct PeerResult {
  uint64_t bytes = 0;
  double seconds = 0;
  std::vector<double> copySeconds;
};

Side parseSide(Napi::Env env, const Napi::Value& v, const char* what) {
  if (!v.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", std::string(what) + " must be a memory object"));
  Napi::Object o = v.As<Napi::Object>();
  std::string kind = toString(getRequired(o, "kind"), "memory.kind");
  Side s;
  if (kind == "device") {
    s.mapping = DeviceAllocation::unwrap(getRequired(o, "allocation"));
  } else if (kind == "imported") {
    int fd = static_cast<int>(toI64(getRequired(o, "fd"), "memory.fd"));
    s.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!s.fd.valid()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory.fd " + std::to_string(fd) + " is not an open descriptor"));
  } else {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", std::string(what) + ".kind must be 'device' or 'imported'"));
  }
  return s;
}

PeerResult runPeerCopy(int device, std::vector<Pair>& pairs, uint32_t repeats) {
  auto ctx = cuda::acquireContext(device);
  for (auto& p : pairs) {
    for (Side* s : {&p.src, &p.dst}) {
      if (!s->mapping) s->mapping = std::shared_ptr<cuda::Mapping>(cuda::Mapping::import(s->fd.get(), p.size));
      if (p.size > s->mapping->size()) throwInvalid("a peer copy of " + std::to_string(p.size) + " bytes does not fit its memory");
      if (s->mapping->device() != device) {
        cuda::enablePeerAccess(ctx, s->mapping->context());
        cuda::grantAccess(*s->mapping, device);
      }
    }
  }
  PeerResult r;
  auto start = std::chrono::steady_clock::now();
  {
    cuda::CopyStream stream(ctx);
    for (uint32_t i = 0; i < repeats; i++) {
      auto t0 = std::chrono::steady_clock::now();
      for (auto& p : pairs) {
        if (p.size) stream.deviceToDevice(p.dst.mapping->address(), p.src.mapping->address(), p.size);
      }
      stream.synchronize();
      r.copySeconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& p : pairs) r.bytes += p.size;
  for (auto& p : pairs) {  // unmap imported memory before the promise settles
    p.src = Side{};
    p.dst = Side{};
  }
  return r;
}

}  // namespace

void initPeer(Napi::Env env, Napi::Object exports) {
  exports.Set("canAccessPeer", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    int a = static_cast<int>(toI64(info[0], "device"));
    int b = static_cast<int>(toI64(info[1], "peer"));
    return Napi::Boolean::New(info.Env(), guard(info.Env(), [&] { return cuda::canAccessPeer(a, b); }));
  }, "canAccessPeer"));
  exports.Set("peerCopy", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    Napi::Env e = info.Env();
    if (!info[0].IsObject()) throw toJsError(e, NativeError("E_INVALID_ARGUMENT", "peerCopy needs a spec object"));
    Napi::Object spec = info[0].As<Napi::Object>();
    int device = static_cast<int>(toI64(getRequired(spec, "device"), "device"));
    uint32_t repeats = spec.Has("repeats") && !spec.Get("repeats").IsUndefined() ? static_cast<uint32_t>(toU64(spec.Get("repeats"), "repeats")) : 1;
    if (repeats == 0 || repeats > 100) throw toJsError(e, NativeError("E_INVALID_ARGUMENT", "repeats must be 1..100"));
    Napi::Value pv = getRequired(spec, "pairs");
    if (!pv.IsArray()) throw toJsError(e, NativeError("E_INVALID_ARGUMENT", "pairs must be an array"));
    Napi::Array arr = pv.As<Napi::Array>();
    auto pairs = std::make_shared<std::vector<Pair>>();
    for (uint32_t i = 0; i < arr.Length(); i++) {
      if (!arr.Get(i).IsObject()) throw toJsError(e, NativeError("E_INVALID_ARGUMENT", "pairs[" + std::to_string(i) + "] must be an object"));
      Napi::Object o = arr.Get(i).As<Napi::Object>();
      Pair p;
      p.src = parseSide(e, getRequired(o, "src"), "src");
      p.dst = parseSide(e, getRequired(o, "dst"), "dst");
      p.size = toU64(getRequired(o, "size"), "size");
      pairs->push_back(std::move(p));
    }
    return PromiseWorker<PeerResult>::Run(
        e, [device, pairs, repeats] { return runPeerCopy(device, *pairs, repeats); },
        [](Napi::Env env, PeerResult& r) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("bytes", static_cast<double>(r.bytes));
          o.Set("seconds", r.seconds);
          Napi::Array t = Napi::Array::New(env, r.copySeconds.size());
          for (size_t i = 0; i < r.copySeconds.size(); i++) t.Set(i, r.copySeconds[i]);
          o.Set("copySeconds", t);
          return o;
        });
  }, "peerCopy"));
}

}  // namespace vsnap::js
