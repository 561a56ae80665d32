#include "transfer/region_batch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "common/error.h"
#include "common/fault.h"
#include "cuda/context.h"
#include "cuda/vmm.h"
#include "cuda/vmm_batch.h"
#include "cuda/vmm_timing.h"
#include "io/files.h"
#include "transfer/region_set.h"

namespace vsnap::transfer {
namespace {

using cuda::VmmStep;
using cuda::VmmTimer;

// Driver calls serialise on a per-context lock, but mmap with MAP_POPULATE and the page-table
// work of cuMemMap do not: a few threads are enough to hide one region's latency behind another's.
constexpr uint32_t kDefaultThreads = 4;
// Below this many regions per thread, starting threads costs more than it saves.
constexpr size_t kRegionsPerThread = 8;

uint64_t roundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// The steps of one backend; `group` is the device (-1: host memory).
class Backend {
 public:
  struct Handle {
    uint64_t handle = 0;
    int group = -1;
    uint64_t granularity = 4096;
  };
  virtual ~Backend() = default;
  virtual const char* errorCode() const = 0;
  virtual Handle import(int fd, uint64_t size) = 0;
  virtual void release(uint64_t handle) noexcept = 0;
  virtual void prepare(int group) = 0;  // before the steps below, on the calling thread
  virtual uint64_t reserve(uint64_t bytes, uint64_t alignment) = 0;
  virtual void addressFree(uint64_t va, uint64_t bytes) noexcept = 0;
  virtual void map(uint64_t va, uint64_t bytes, uint64_t handle) = 0;
  virtual void setAccess(int group, uint64_t va, uint64_t bytes, uint64_t regions) = 0;
  virtual bool unmapRange(uint64_t va, uint64_t bytes, uint64_t regions) noexcept = 0;
  virtual void unmap(uint64_t va, uint64_t bytes) noexcept = 0;
  virtual std::shared_ptr<Region> region(std::shared_ptr<void> keep, int group, uint64_t va, uint64_t mapped, uint64_t size) = 0;
};

class CudaBackend final : public Backend {
 public:
  const char* errorCode() const override { return "E_CUDA"; }
  Handle import(int fd, uint64_t size) override {
    if (size == 0) throwInvalid("imported region size must be > 0");
    cuda::vmm::Imported imported = cuda::vmm::importFd(fd);
    try {
      VmmTimer timer(VmmStep::Setup);
      std::lock_guard<std::mutex> lock(mutex_);
      auto& d = devices_[imported.device];
      if (!d.ctx) {
        d.ctx = cuda::acquireContext(imported.device);
        d.granularity = cuda::vmm::granularity(imported.device);
      }
      countImport();
      return {imported.handle, imported.device, d.granularity};
    } catch (...) {
      cuda::vmm::release(imported.handle);
      throw;
    }
  }
  void release(uint64_t handle) noexcept override { cuda::vmm::release(handle); }
  void prepare(int group) override { context(group)->makeCurrent(); }
  uint64_t reserve(uint64_t bytes, uint64_t alignment) override { return cuda::vmm::reserve(bytes, alignment); }
  void addressFree(uint64_t va, uint64_t bytes) noexcept override { cuda::vmm::addressFree(va, bytes); }
  void map(uint64_t va, uint64_t bytes, uint64_t handle) override { cuda::vmm::map(va, bytes, handle); }
  void setAccess(int group, uint64_t va, uint64_t bytes, uint64_t regions) override { cuda::vmm::setAccess(group, va, bytes, regions); }
  bool unmapRange(uint64_t va, uint64_t bytes, uint64_t regions) noexcept override { return cuda::vmm::unmapRange(va, bytes, regions); }
  void unmap(uint64_t va, uint64_t bytes) noexcept override { cuda::vmm::unmap(va, bytes); }
  std::shared_ptr<Region> region(std::shared_ptr<void> keep, int group, uint64_t va, uint64_t mapped, uint64_t size) override {
    return deviceRegion(cuda::Mapping::view(std::move(keep), context(group), va, mapped), size);
  }

 private:
  std::shared_ptr<cuda::Context> context(int group) {
    std::lock_guard<std::mutex> lock(mutex_);
    return devices_.at(group).ctx;
  }
  struct Device {
    std::shared_ptr<cuda::Context> ctx;
    uint64_t granularity = 0;
  };
  std::mutex mutex_;
  std::map<int, Device> devices_;  // retained while the batch lives
};

// Host memory (memfd) of a batch: mapped in place, unmapped by the batch.
class BatchHostRegion final : public Region {
 public:
  BatchHostRegion(std::shared_ptr<void> keep, char* base, uint64_t size) : keep_(std::move(keep)), base_(base), size_(size) {}
  uint64_t size() const override { return size_; }
  int device() const override { return -1; }
  const char* mappedHost() const override { return base_; }
  const void* span() const override { return keep_.get(); }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane&, int, Fence&) override {
    check(offset, length);
    std::memcpy(dst, base_ + offset, length);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane&, int, Fence&) override {
    check(offset, length);
    std::memcpy(base_ + offset, src, length);
  }

 private:
  void check(uint64_t offset, uint64_t length) const {
    if (offset > size_ || length > size_ - offset) {
      throw NativeError("E_OUT_OF_RANGE", "copy of [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                              ") is outside a region of " + std::to_string(size_) + " bytes");
    }
  }
  std::shared_ptr<void> keep_;
  char* base_;
  uint64_t size_;
};

class HostBackend final : public Backend {
 public:
  const char* errorCode() const override { return "E_IO"; }
  Handle import(int fd, uint64_t size) override {
    VmmTimer timer(VmmStep::Import);
    uint64_t actual = io::fdSize(fd);
    if (actual < size) {
      throwInvalid("host region descriptor holds " + std::to_string(actual) + " bytes, less than the " + std::to_string(size) +
                   " the region declares");
    }
    return {static_cast<uint64_t>(fd), -1, static_cast<uint64_t>(sysconf(_SC_PAGESIZE))};
  }
  void release(uint64_t) noexcept override { VmmTimer timer(VmmStep::Release); }  // the fd is the caller's
  void prepare(int) override {}
  uint64_t reserve(uint64_t bytes, uint64_t) override {
    VmmTimer timer(VmmStep::Reserve);
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throwSystemError("mmap", "host region reservation of " + std::to_string(bytes) + " bytes", errno);
    return reinterpret_cast<uint64_t>(p);
  }
  void addressFree(uint64_t va, uint64_t bytes) noexcept override {
    VmmTimer timer(VmmStep::AddressFree);
    munmap(reinterpret_cast<void*>(va), bytes);
  }
  void map(uint64_t va, uint64_t bytes, uint64_t handle) override {
    VmmTimer timer(VmmStep::Map);
    // MAP_POPULATE maps every page in one pass instead of one fault per 4 KiB page per job.
    void* p = mmap(reinterpret_cast<void*>(va), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, static_cast<int>(handle), 0);
    if (p == MAP_FAILED) throwSystemError("mmap", "host region fd " + std::to_string(handle), errno);
    countHostMap();
  }
  void setAccess(int, uint64_t va, uint64_t bytes, uint64_t regions) override {
    VmmTimer timer(VmmStep::Access, regions);
    if (mprotect(reinterpret_cast<void*>(va), bytes, PROT_READ | PROT_WRITE) != 0) throwSystemError("mprotect", "host region range", errno);
  }
  bool unmapRange(uint64_t va, uint64_t bytes, uint64_t regions) noexcept override {
    VmmTimer timer(VmmStep::Unmap, regions);
    bool ok = toReservation(va, bytes);
    if (!ok) timer.fail();
    return ok;
  }
  void unmap(uint64_t va, uint64_t bytes) noexcept override {
    VmmTimer timer(VmmStep::Unmap);
    toReservation(va, bytes);
  }
  std::shared_ptr<Region> region(std::shared_ptr<void> keep, int, uint64_t va, uint64_t, uint64_t size) override {
    return std::make_shared<BatchHostRegion>(std::move(keep), reinterpret_cast<char*>(va), size);
  }

 private:
  // Back to reserved address space (as cuMemUnmap leaves a reservation), freed with the rest.
  static bool toReservation(uint64_t va, uint64_t bytes) {
    return mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) != MAP_FAILED;
  }
};

struct Item {
  BatchInput in;
  uint64_t handle = 0;
  bool imported = false;
  int group = -1;
  uint64_t granularity = 1;
  uint64_t rounded = 0;
  uint64_t va = 0;
  bool mapped = false;
};

struct Reservation {
  int group = -1;
  uint64_t base = 0;
  uint64_t bytes = 0;
  std::vector<size_t> items;  // in address order, each mapped at its own offset
};

// Everything one batch imported, reserved and mapped; undone (in reverse) when it goes.
class Batch {
 public:
  explicit Batch(std::unique_ptr<Backend> backend) : backend(std::move(backend)) {}
  ~Batch() { undo(); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  std::unique_ptr<Backend> backend;
  std::vector<Item> items;
  std::vector<Reservation> reservations;

 private:
  void undo() noexcept {
    for (const Reservation& r : reservations) {
      try {
        backend->prepare(r.group);
      } catch (...) {  // the context is held by the backend: cannot fail once made
      }
      bool all = !r.items.empty() && std::all_of(r.items.begin(), r.items.end(), [&](size_t i) { return items[i].mapped; });
      if (all) {
        const Item& last = items[r.items.back()];
        uint64_t end = last.va + last.rounded;
        if (backend->unmapRange(r.base, end - r.base, r.items.size())) {
          for (size_t i : r.items) items[i].mapped = false;
        }
      }
      for (size_t i : r.items) {
        if (items[i].mapped) backend->unmap(items[i].va, items[i].rounded);
        items[i].mapped = false;
      }
      backend->addressFree(r.base, r.bytes);
    }
    for (Item& it : items) {
      if (it.imported) backend->release(it.handle);
      it.imported = false;
    }
  }
};

[[noreturn]] void injected(const Backend& b, const char* step) {
  throw NativeError(b.errorCode(), std::string("injected fault at the batched ") + step + " step (test)");
}

}  // namespace

void forEachRegion(size_t n, uint32_t threads, const std::function<void(size_t)>& fn, const std::function<size_t(size_t)>& label) {
  uint32_t wanted = threads ? threads : kDefaultThreads;
  uint32_t workers = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>(wanted, (n + kRegionsPerThread - 1) / kRegionsPerThread)));
  std::atomic<size_t> cursor{0};
  std::atomic<bool> failed{false};
  std::mutex errorMutex;
  std::optional<NativeError> error;
  auto work = [&] {
    while (!failed.load()) {
      size_t i = cursor.fetch_add(1);
      if (i >= n) return;
      std::optional<NativeError> e;
      try {
        fn(i);
      } catch (const NativeError& x) {
        e = x;
      } catch (const std::exception& x) {
        e = NativeError("E_INTERNAL", x.what());
      }
      if (e) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!error) error = NativeError(e->code(), "region " + std::to_string(label(i)) + ": " + e->what(), e->details());
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t w = 1; w < workers; w++) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // the calling thread still does the work
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) throw *error;
}

std::vector<std::shared_ptr<Region>> openBatched(const std::vector<BatchInput>& inputs, bool imported, uint32_t threads) {
  std::unique_ptr<Backend> backend = imported ? std::unique_ptr<Backend>(new CudaBackend()) : std::unique_ptr<Backend>(new HostBackend());
  auto batch = std::make_shared<Batch>(std::move(backend));  // undone by its destructor when this throws
  Backend& b = *batch->backend;
  std::vector<Item>& items = batch->items;
  items.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); i++) items[i].in = inputs[i];
  auto label = [&](size_t i) { return items[i].in.label; };

  // 1. Import every allocation (the per-region step no batching removes), on a few threads.
  forEachRegion(items.size(), threads, [&](size_t i) {
    Item& it = items[i];
    if (fault::hit(fault::Point::MapImport)) injected(b, "import");
    Backend::Handle h = b.import(it.in.fd, it.in.size);
    it.handle = h.handle;
    it.group = h.group;
    it.granularity = h.granularity;
    it.rounded = roundUp(it.in.size, h.granularity);
    it.imported = true;
  }, label);

  // 2. One reservation per device, each allocation at an offset aligned to its granularity.
  std::map<int, std::vector<size_t>> groups;
  for (size_t i = 0; i < items.size(); i++) {
    if (items[i].rounded > 0) groups[items[i].group].push_back(i);
  }
  for (auto& [group, members] : groups) {
    uint64_t offset = 0, alignment = 1;
    for (size_t i : members) {
      offset = roundUp(offset, items[i].granularity) + items[i].rounded;
      alignment = std::max(alignment, items[i].granularity);
    }
    uint64_t bytes = roundUp(offset, alignment);
    b.prepare(group);
    if (fault::hit(fault::Point::MapReserve)) injected(b, "reserve");
    uint64_t base;
    try {
      base = b.reserve(bytes, alignment);
    } catch (const NativeError& e) {
      throw NativeError(e.code(), "region " + std::to_string(items[members[0]].in.label) + ": " + e.what(), e.details());
    }
    batch->reservations.push_back({group, base, bytes, members});
    offset = 0;
    for (size_t i : members) {
      offset = roundUp(offset, items[i].granularity);
      items[i].va = base + offset;
      offset += items[i].rounded;
    }
  }

  // 3. Map each allocation at its place, on a few threads.
  std::vector<size_t> toMap;
  for (const Reservation& r : batch->reservations) toMap.insert(toMap.end(), r.items.begin(), r.items.end());
  forEachRegion(toMap.size(), threads, [&](size_t k) {
    Item& it = items[toMap[k]];
    b.prepare(it.group);
    if (fault::hit(fault::Point::MapMap)) injected(b, "map");
    b.map(it.va, it.rounded, it.handle);
    it.mapped = true;
  }, [&](size_t k) { return items[toMap[k]].in.label; });

  // 4. One access call per contiguous run of mappings (a whole reservation when the device's
  // allocations share one granularity, as they do).
  for (const Reservation& r : batch->reservations) {
    b.prepare(r.group);
    size_t start = 0;
    for (size_t k = 1; k <= r.items.size(); k++) {
      const Item& prev = items[r.items[k - 1]];
      if (k < r.items.size() && items[r.items[k]].va == prev.va + prev.rounded) continue;
      const Item& first = items[r.items[start]];
      if (fault::hit(fault::Point::MapAccess)) injected(b, "access");
      try {
        b.setAccess(r.group, first.va, prev.va + prev.rounded - first.va, k - start);
      } catch (const NativeError& e) {
        throw NativeError(e.code(), "region " + std::to_string(first.in.label) + ": " + e.what(), e.details());
      }
      start = k;
    }
  }

  std::vector<std::shared_ptr<Region>> regions(items.size());
  std::shared_ptr<void> keep = batch;
  for (size_t i = 0; i < items.size(); i++) {
    const Item& it = items[i];
    if (it.rounded == 0) {  // an empty host region: nothing to map
      regions[i] = std::make_shared<BatchHostRegion>(keep, nullptr, 0);
    } else {
      regions[i] = b.region(keep, it.group, it.va, it.rounded, it.in.size);
    }
  }
  return regions;
}

}  // namespace vsnap::transfer
