// The GPU digest (native/digest): digestRegions(regions) -> Promise<{ digests, backends,
// kernelMs, seconds }> off the JS thread (device and imported memory on the GPU, host memory on
// the CPU, one digest per chunk); digestBytes(data, chunkSize) (CPU, synchronous);
// digestBench(src, dst, size, chunkSize, repeats) (kernel vs device-to-device copy, CUDA events).
#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/fd.h"
#include "cuda/vmm.h"
#include "digest/digest.h"
#include "io/files.h"
#include "js/js_allocation.h"
#include "js/js_host_buffer.h"
#include "js/js_region_set.h"
#include "js/js_util.h"
#include "js/parallel.h"
#include "transfer/host_buffer.h"
#include "transfer/region_set.h"

namespace vsnap::js {
namespace {

struct DigestTarget {
  enum class Kind { Host, Imported, Device, Buffer, Mapped } kind = Kind::Host;
  UniqueFd fd;  // our own duplicate
  std::shared_ptr<cuda::Mapping> mapping;
  std::shared_ptr<transfer::HostBuffer> buffer;
  std::shared_ptr<transfer::Region> region;  // a RegionSet's region, mapped already
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t chunkSize = 0;
};

struct DigestResult {
  std::vector<std::vector<digest::Hash128>> digests;
  std::vector<std::string> backends;
  std::vector<float> kernelMs;
  // Per GPU: the device, the bytes it digested, the wall time of its batch, its kernels' time.
  struct Device {
    int device = -1;
    uint64_t bytes = 0;
    double seconds = 0;
    float kernelMs = 0;
  };
  std::vector<Device> devices;
  double seconds = 0;
};

std::vector<digest::Hash128> digestHostFd(int fd, uint64_t size, uint64_t chunkSize) {
  if (size == 0) return {};
  if (io::fdSize(fd) < size) throwInvalid("host region descriptor holds fewer bytes than the region declares");
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) throwSystemError("mmap", "host region fd " + std::to_string(fd), errno);
  transfer::countHostMap();
  try {
    auto out = digest::digestHost(static_cast<const unsigned char*>(base), size, chunkSize);
    munmap(base, size);
    return out;
  } catch (...) {
    munmap(base, size);
    throw;
  }
}

DigestResult run(std::vector<DigestTarget>& targets) {
  auto start = std::chrono::steady_clock::now();
  DigestResult r;
  r.digests.resize(targets.size());
  r.backends.assign(targets.size(), "cpu");
  r.kernelMs.assign(targets.size(), 0);
  std::vector<std::shared_ptr<cuda::Mapping>> mappings(targets.size());
  std::vector<size_t> imported;
  for (size_t i = 0; i < targets.size(); i++) {
    auto& t = targets[i];
    switch (t.kind) {
      case DigestTarget::Kind::Host:
        r.digests[i] = digestHostFd(t.fd.get(), t.size, t.chunkSize);
        break;
      case DigestTarget::Kind::Buffer:
        if (t.offset > t.buffer->size() || t.size > t.buffer->size() - t.offset) throwInvalid("digest range is outside its HostBuffer");
        r.digests[i] = digest::digestHost(reinterpret_cast<const unsigned char*>(t.buffer->data()) + t.offset, t.size, t.chunkSize);
        break;
      case DigestTarget::Kind::Mapped:
        if (t.size > t.region->size()) throwInvalid("digest range is larger than its region");
        if (auto m = t.region->deviceMapping()) {
          mappings[i] = m;
        } else if (const char* host = t.region->mappedHost()) {
          r.digests[i] = digest::digestHost(reinterpret_cast<const unsigned char*>(host), t.size, t.chunkSize);
        } else if (t.size != 0) {
          throwInvalid("a mapped region without host or device memory to digest");
        }
        break;
      case DigestTarget::Kind::Imported:
        imported.push_back(i);
        break;
      case DigestTarget::Kind::Device:
        if (t.size > t.mapping->size()) throwInvalid("digest range is larger than its device allocation");
        mappings[i] = t.mapping;
        break;
    }
  }
  // Imported memory is mapped for this call only, several regions at once (each mapping is made
  // with its own device's context: the handle says where the memory is).
  parallelFor(imported.size(), 8, [&](size_t k) {
    size_t i = imported[k];
    transfer::countImport();
    mappings[i] = std::shared_ptr<cuda::Mapping>(cuda::Mapping::import(targets[i].fd.get(), targets[i].size));
  });
  // GPU targets are grouped by device; every device digests its batch at once, in one launch
  // sequence on its own context and stream, on its own thread, so the GPUs of a tensor-parallel
  // engine are checked concurrently, not one after the other. Each device's thread also drops
  // its imported mappings.
  std::map<int, std::vector<size_t>> byDevice;
  for (size_t i = 0; i < targets.size(); i++) {
    if (mappings[i]) byDevice[mappings[i]->device()].push_back(i);
  }
  std::vector<std::pair<int, std::vector<size_t>>> groups(byDevice.begin(), byDevice.end());
  r.devices.resize(groups.size());
  parallelFor(groups.size(), groups.size(), [&](size_t g) {
    auto& [device, indices] = groups[g];
    auto t0 = std::chrono::steady_clock::now();
    std::vector<digest::DeviceSpan> spans;
    uint64_t bytes = 0;
    for (size_t i : indices) {
      spans.push_back({mappings[i]->address(), targets[i].size, targets[i].chunkSize});
      bytes += targets[i].size;
    }
    float ms = 0;
    auto digests = digest::digestDevice(mappings[indices[0]]->context(), spans, &ms);
    for (size_t k = 0; k < indices.size(); k++) {
      r.digests[indices[k]] = std::move(digests[k]);
      r.backends[indices[k]] = "gpu";
    }
    r.kernelMs[indices[0]] = ms;  // the batch's kernel time, once per device
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.devices[g] = {device, bytes, seconds, ms};
    for (size_t i : indices) mappings[i].reset();
  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

DigestTarget parseTarget(Napi::Env env, const Napi::Object& o) {
  DigestTarget t;
  t.size = toU64(getRequired(o, "size"), "size");
  t.chunkSize = toU64(getRequired(o, "chunkSize"), "chunkSize");
  Napi::Value mv = getRequired(o, "memory");
  if (!mv.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory must be an object"));
  Napi::Object m = mv.As<Napi::Object>();
  std::string kind = toString(getRequired(m, "kind"), "memory.kind");
  if (kind == "device") {
    t.kind = DigestTarget::Kind::Device;
    t.mapping = DeviceAllocation::unwrap(getRequired(m, "allocation"));
  } else if (kind == "buffer") {
    t.kind = DigestTarget::Kind::Buffer;
    t.buffer = HostBuffer::unwrap(getRequired(m, "buffer"));
    t.offset = m.Has("offset") ? toU64(m.Get("offset"), "memory.offset") : 0;
  } else if (kind == "mapped") {
    t.kind = DigestTarget::Kind::Mapped;
    t.region = RegionSet::region(m);
  } else if (kind == "host" || kind == "imported") {
    t.kind = kind == "host" ? DigestTarget::Kind::Host : DigestTarget::Kind::Imported;
    int fd = static_cast<int>(toI64(getRequired(m, "fd"), "memory.fd"));
    t.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!t.fd.valid()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory.fd " + std::to_string(fd) + " is not an open descriptor"));
  } else {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory.kind must be 'host', 'imported', 'device', 'buffer' or 'mapped'"));
  }
  return t;
}

Napi::Value DigestRegions(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "digestRegions needs an array of regions"));
  Napi::Array list = info[0].As<Napi::Array>();
  auto targets = std::make_shared<std::vector<DigestTarget>>();
  for (uint32_t i = 0; i < list.Length(); i++) {
    if (!list.Get(i).IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "regions[" + std::to_string(i) + "] must be an object"));
    targets->push_back(parseTarget(env, list.Get(i).As<Napi::Object>()));
  }
  return PromiseWorker<DigestResult>::Run(
      env, [targets] { return run(*targets); },
      [](Napi::Env env, DigestResult& r) -> Napi::Value {
        Napi::Object out = Napi::Object::New(env);
        Napi::Array all = Napi::Array::New(env, r.digests.size());
        Napi::Array backends = Napi::Array::New(env, r.backends.size());
        Napi::Array kernelMs = Napi::Array::New(env, r.kernelMs.size());
        for (size_t i = 0; i < r.digests.size(); i++) {
          Napi::Array one = Napi::Array::New(env, r.digests[i].size());
          for (size_t c = 0; c < r.digests[i].size(); c++) one.Set(c, r.digests[i][c].hex());
          all.Set(i, one);
          backends.Set(i, r.backends[i]);
          kernelMs.Set(i, r.kernelMs[i]);
        }
        out.Set("digests", all);
        out.Set("backends", backends);
        out.Set("kernelMs", kernelMs);
        out.Set("seconds", r.seconds);
        Napi::Array devices = Napi::Array::New(env, r.devices.size());
        for (size_t g = 0; g < r.devices.size(); g++) {
          Napi::Object d = Napi::Object::New(env);
          d.Set("device", r.devices[g].device);
          d.Set("bytes", static_cast<double>(r.devices[g].bytes));
          d.Set("seconds", r.devices[g].seconds);
          d.Set("kernelMs", r.devices[g].kernelMs);
          devices.Set(g, d);
        }
        out.Set("devices", devices);
        return out;
      });
}

Napi::Value DigestBytes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsTypedArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "digestBytes needs a Buffer or Uint8Array"));
  auto data = info[0].As<Napi::Uint8Array>();
  uint64_t chunkSize = toU64(info[1], "chunkSize");
  auto digests = guard(env, [&] { return digest::digestHost(data.Data(), data.ByteLength(), chunkSize); });
  Napi::Array out = Napi::Array::New(env, digests.size());
  for (size_t i = 0; i < digests.size(); i++) out.Set(i, digests[i].hex());
  return out;
}

Napi::Value DigestBench(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto src = DeviceAllocation::unwrap(info[0]);
  auto dst = DeviceAllocation::unwrap(info[1]);
  uint64_t size = toU64(info[2], "size");
  uint64_t chunkSize = toU64(info[3], "chunkSize");
  int repeats = static_cast<int>(toU64(info[4], "repeats"));
  if (size > src->size() || size > dst->size() || src->device() != dst->device()) {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "digestBench needs two allocations of at least size bytes on one device"));
  }
  return PromiseWorker<digest::BenchTimes>::Run(
      env, [=] { return digest::benchDevice(src->context(), src->address(), dst->address(), size, chunkSize, repeats); },
      [](Napi::Env env, digest::BenchTimes& t) -> Napi::Value {
        Napi::Object out = Napi::Object::New(env);
        Napi::Array d = Napi::Array::New(env, t.digestMs.size()), c = Napi::Array::New(env, t.copyMs.size());
        for (size_t i = 0; i < t.digestMs.size(); i++) d.Set(i, t.digestMs[i]);
        for (size_t i = 0; i < t.copyMs.size(); i++) c.Set(i, t.copyMs[i]);
        out.Set("digestMs", d);
        out.Set("copyMs", c);
        return out;
      });
}

}  // namespace

void initDigest(Napi::Env env, Napi::Object exports) {
  exports.Set("digestRegions", Napi::Function::New(env, DigestRegions, "digestRegions"));
  exports.Set("digestBytes", Napi::Function::New(env, DigestBytes, "digestBytes"));
  exports.Set("digestBench", Napi::Function::New(env, DigestBench, "digestBench"));
  exports.Set("digestAlgorithm", Napi::String::New(env, "vsnap-gd1"));
}

}  // namespace vsnap::js
