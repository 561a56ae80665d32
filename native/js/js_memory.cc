#include "js/js_memory.h"

#include <fcntl.h>

#include "cuda/vmm.h"
#include "js/js_allocation.h"
#include "js/js_host_buffer.h"
#include "js/js_region_set.h"
#include "js/js_util.h"
#include "transfer/host_buffer.h"
#include "transfer/region_set.h"

namespace vsnap::js {

std::unique_ptr<transfer::Region> MemorySpec::open(uint64_t size) const {
  switch (kind) {
    case Kind::Host: return transfer::hostRegion(fd.get(), size);
    case Kind::Imported: return transfer::importedRegion(fd.get(), size);
    case Kind::Device: return transfer::deviceRegion(mapping, size);
    case Kind::Buffer: return transfer::bufferRegion(buffer, offset, size);
    case Kind::Mapped: return transfer::sharedRegion(mapped);
    case Kind::None: break;
  }
  return nullptr;
}

MemorySpec parseMemory(Napi::Env env, const Napi::Value& value) {
  MemorySpec spec;
  if (value.IsUndefined() || value.IsNull()) return spec;
  if (!value.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory must be an object"));
  Napi::Object o = value.As<Napi::Object>();
  std::string kind = toString(getRequired(o, "kind"), "memory.kind");
  if (kind == "device") {
    spec.kind = MemorySpec::Kind::Device;
    spec.mapping = DeviceAllocation::unwrap(getRequired(o, "allocation"));
    return spec;
  }
  if (kind == "buffer") {
    spec.kind = MemorySpec::Kind::Buffer;
    spec.buffer = HostBuffer::unwrap(getRequired(o, "buffer"));
    spec.offset = o.Has("offset") ? toU64(o.Get("offset"), "memory.offset") : 0;
    return spec;
  }
  if (kind == "mapped") {
    spec.kind = MemorySpec::Kind::Mapped;
    spec.mapped = RegionSet::region(o);
    return spec;
  }
  if (kind != "host" && kind != "imported") {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory.kind must be 'host', 'imported', 'device', 'buffer' or 'mapped'"));
  }
  spec.kind = kind == "host" ? MemorySpec::Kind::Host : MemorySpec::Kind::Imported;
  int fd = static_cast<int>(toI64(getRequired(o, "fd"), "memory.fd"));
  spec.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!spec.fd.valid()) {
    throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "memory.fd " + std::to_string(fd) + " is not an open descriptor"));
  }
  return spec;
}


}  // namespace vsnap::js
