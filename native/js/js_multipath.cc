// startMultipath(spec, onProgress) -> { promise, cancel, cancelRelay, ringBytes }: one
// multi-path restore (transfer/multipath.h) off the JS thread.
//
// spec: { label, backend: 'cuda' | 'host', chunkSize, directSlots?, directStreams?, relaySlots?, neighbour?,
//         requireRelay?, relayReleased?, faults?: { failRelayAt, failDirectAt, relayDelayMs, directDelayMs,
//         relayChunks, holdRelay } (host; the last two: MultipathTestSchedule),
//         regions: [{ name, size, memory: Memory (the target), source: { kind: 'buffer', buffer, offset } }] }
// cuda: memory is { kind: 'device', allocation } | { kind: 'imported', fd }; host: { kind: 'host', fd };
// either: { kind: 'mapped', set, index } (a RegionSet's region, of the backend's kind).
// Resolves { bytes, seconds, setupSeconds, teardownSeconds, bytesDirect, bytesRelay, chunksDirect,
//            chunksRelay, requeued, maxRelayInFlight, relayUsed, relayCancelled, relayError,
//            direct: timeline, relay: timeline } (timeline: { firstStart, lastEnd, busySeconds,
//            maxInFlight }, seconds since the copies began; -1: none). releaseWarmNeighbours().
#include <fcntl.h>

#include <chrono>

#include "common/fd.h"
#include "cuda/vmm.h"
#include "js/js_allocation.h"
#include "js/js_host_buffer.h"
#include "js/js_region_set.h"
#include "js/js_util.h"
#include "transfer/host_buffer.h"
#include "transfer/multipath.h"
#include "transfer/region.h"
#include "transfer/region_set.h"

namespace vsnap::js {
namespace {

struct Target {
  std::string name;
  std::string kind;
  UniqueFd fd;
  std::shared_ptr<cuda::Mapping> mapping;
  std::shared_ptr<transfer::Region> mapped;  // a region of a RegionSet (host or imported), kept open by the job
  uint64_t size = 0;
};

struct Spec {
  std::string label;
  bool host = false;
  bool relayReleased = false;  // the neighbour was released before the job started
  uint64_t chunkSize = 0;
  transfer::CudaMultipathOptions cuda;
  transfer::HostBackendFaults faults;
  transfer::MultipathTestSchedule schedule;
  std::vector<Target> targets;
  std::vector<std::shared_ptr<transfer::HostBuffer>> buffers;  // kept alive for the job
  std::vector<const char*> sources;
};

uint32_t optU32(const Napi::Object& o, const char* key, uint32_t fallback) {
  if (!o.Has(key) || o.Get(key).IsUndefined()) return fallback;
  return static_cast<uint32_t>(toU64(o.Get(key), key));
}

Spec parseSpec(Napi::Env env, const Napi::Object& spec) {
  auto bad = [&](const std::string& m) { return toJsError(env, NativeError("E_INVALID_ARGUMENT", m)); };
  Spec s;
  s.label = spec.Has("label") ? toString(spec.Get("label"), "label") : std::string();
  std::string backend = toString(getRequired(spec, "backend"), "backend");
  if (backend != "cuda" && backend != "host") throw bad("backend must be 'cuda' or 'host'");
  s.host = backend == "host";
  s.chunkSize = toU64(getRequired(spec, "chunkSize"), "chunkSize");
  if (s.chunkSize == 0) throw bad("chunkSize must be > 0");
  s.cuda.slotSize = s.chunkSize;
  s.cuda.directSlots = optU32(spec, "directSlots", 4);
  s.cuda.directStreams = optU32(spec, "directStreams", 2);
  s.cuda.relaySlots = optU32(spec, "relaySlots", 4);
  s.cuda.neighbour = spec.Has("neighbour") && !spec.Get("neighbour").IsUndefined() ? static_cast<int>(toI64(spec.Get("neighbour"), "neighbour")) : -1;
  s.cuda.requireRelay = spec.Get("requireRelay").ToBoolean().Value();
  s.relayReleased = spec.Get("relayReleased").ToBoolean().Value();
  if (s.cuda.directSlots == 0 || s.cuda.directSlots > 64 || s.cuda.relaySlots > 64) throw bad("directSlots must be 1..64 and relaySlots 0..64");
  if (s.cuda.directStreams == 0 || s.cuda.directStreams > 16) throw bad("directStreams must be 1..16");
  if (s.relayReleased) {
    // Released before the start: no neighbour context, ring or peer access is set up at all, so
    // the direct path alone costs what a plain restore costs.
    s.cuda.neighbour = -1;
    s.cuda.relaySlots = 0;
  }
  if (spec.Has("faults") && spec.Get("faults").IsObject()) {
    if (!s.host) throw bad("faults are for the host backend only");
    Napi::Object f = spec.Get("faults").As<Napi::Object>();
    s.faults.failRelayAt = optU32(f, "failRelayAt", 0);
    s.faults.failDirectAt = optU32(f, "failDirectAt", 0);
    s.faults.relayDelayMs = optU32(f, "relayDelayMs", 0);
    s.faults.directDelayMs = optU32(f, "directDelayMs", 0);
    s.schedule.relayChunks = optU32(f, "relayChunks", 0);
    s.schedule.holdRelay = f.Get("holdRelay").ToBoolean().Value();
  }
  Napi::Value rv = getRequired(spec, "regions");
  if (!rv.IsArray()) throw bad("regions must be an array");
  Napi::Array regions = rv.As<Napi::Array>();
  for (uint32_t i = 0; i < regions.Length(); i++) {
    if (!regions.Get(i).IsObject()) throw bad("regions[" + std::to_string(i) + "] must be an object");
    Napi::Object r = regions.Get(i).As<Napi::Object>();
    std::string name = toString(getRequired(r, "name"), "region name");
    Target t;
    t.name = name;
    t.size = toU64(getRequired(r, "size"), "size");
    Napi::Value mv = getRequired(r, "memory");
    if (!mv.IsObject()) throw bad("region '" + name + "': memory must be an object");
    Napi::Object m = mv.As<Napi::Object>();
    t.kind = toString(getRequired(m, "kind"), "memory.kind");
    if (t.kind != "mapped" && (s.host ? t.kind != "host" : (t.kind != "device" && t.kind != "imported"))) {
      throw bad("region '" + name + "': the " + backend + " backend restores into " + (s.host ? "'host'" : "'device' or 'imported'") + " or 'mapped' memory");
    }
    if (t.kind == "mapped") {
      // A region set's mapping, shared: the set may be closed while the job runs.
      t.mapped = RegionSet::region(m);
      if (t.mapped->size() < t.size) throw bad("region '" + name + "' is larger than its mapped region");
      if (s.host != (t.mapped->device() < 0)) throw bad("region '" + name + "': mapped " + (s.host ? "GPU" : "host") + " memory for the " + backend + " backend");
      // Its device mapping is taken in Execute: a pipelined set's region may still be mapping,
      // and waiting for it here would hold the JS thread.
    } else if (t.kind == "device") {
      t.mapping = DeviceAllocation::unwrap(getRequired(m, "allocation"));
      if (t.mapping->size() < t.size) throw bad("region '" + name + "' is larger than its device allocation");
    } else {
      int fd = static_cast<int>(toI64(getRequired(m, "fd"), "memory.fd"));
      t.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!t.fd.valid()) throw bad("region '" + name + "': memory.fd " + std::to_string(fd) + " is not an open descriptor");
    }
    Napi::Value sv = getRequired(r, "source");
    if (!sv.IsObject()) throw bad("region '" + name + "': source must be a HostBuffer slice");
    Napi::Object so = sv.As<Napi::Object>();
    auto buffer = HostBuffer::unwrap(getRequired(so, "buffer"));
    uint64_t offset = so.Has("offset") ? toU64(so.Get("offset"), "source.offset") : 0;
    if (offset > buffer->size() || t.size > buffer->size() - offset) throw bad("region '" + name + "': source slice is outside its HostBuffer");
    s.sources.push_back(buffer->data() + offset);
    s.buffers.push_back(std::move(buffer));
    s.targets.push_back(std::move(t));
  }
  return s;
}

class MultipathWorker : public Napi::AsyncWorker {
 public:
  MultipathWorker(Napi::Env env, Spec spec, Napi::Value onProgress)
      : Napi::AsyncWorker(env, "vsnap-multipath"), deferred_(Napi::Promise::Deferred::New(env)), spec_(std::move(spec)),
        lifecycle_(addonData(env).lifecycle), control_(std::make_shared<Control>()) {
    lifecycle_->add(this, [c = control_] { c->cancel(); });  // cancelled if the environment goes first
    if (onProgress.IsFunction()) {
      progress_ = Napi::ThreadSafeFunction::New(env, onProgress.As<Napi::Function>(), "vsnap-multipath-progress", 0, 1);
      hasProgress_ = true;
    }
  }
  ~MultipathWorker() override { lifecycle_->remove(this); }

  // Cancellation may arrive before the job exists (it is built off the JS thread).
  struct Control {
    std::mutex mutex;
    std::shared_ptr<transfer::MultipathJob> job;
    std::shared_ptr<transfer::MultipathBackend> backend;
    bool cancelled = false, relayCancelled = false;
    void cancel() {
      std::lock_guard<std::mutex> l(mutex);
      cancelled = true;
      if (job) job->cancel();
    }
    void cancelRelay() {
      std::lock_guard<std::mutex> l(mutex);
      relayCancelled = true;
      if (job) job->cancelRelay();
    }
    uint64_t ringBytes() {
      std::lock_guard<std::mutex> l(mutex);
      return backend ? backend->ringBytes() : 0;
    }
  };
  Napi::Promise promise() { return deferred_.Promise(); }
  std::shared_ptr<Control> control() { return control_; }

 protected:
  void Execute() override {
    auto start = std::chrono::steady_clock::now();
    error_ = captureError([this, &start] {
      std::vector<uint64_t> sizes;
      std::shared_ptr<transfer::MultipathBackend> backend;
      if (spec_.host) {
        std::vector<std::unique_ptr<transfer::Region>> regions;
        for (auto& t : spec_.targets) {
          regions.push_back(t.mapped ? transfer::sharedRegion(t.mapped) : transfer::hostRegion(t.fd.get(), t.size));
          sizes.push_back(t.size);
        }
        backend = transfer::asBackend(transfer::hostMultipathBackend(std::move(regions), spec_.sources, spec_.cuda.directSlots,
                                                                     spec_.cuda.relaySlots, spec_.chunkSize, spec_.faults));
      } else {
        std::vector<std::shared_ptr<cuda::Mapping>> mappings;
        for (auto& t : spec_.targets) {
          if (t.mapped) {
            t.mapping = t.mapped->deviceMapping();
            if (!t.mapping) throwInvalid("region '" + t.name + "': the mapped region has no device mapping");
          }
          mappings.push_back(t.mapping ? t.mapping : std::shared_ptr<cuda::Mapping>(cuda::Mapping::import(t.fd.get(), t.size)));
          sizes.push_back(t.size);
        }
        backend = transfer::cudaMultipathBackend(std::move(mappings), spec_.sources, spec_.cuda);
      }
      auto job = std::make_shared<transfer::MultipathJob>(spec_.label, sizes, spec_.chunkSize, backend);
      job->setTestSchedule(spec_.schedule);
      setupSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      {
        std::lock_guard<std::mutex> l(control_->mutex);
        control_->job = job;
        control_->backend = backend;
        if (control_->cancelled) job->cancel();
        if (control_->relayCancelled || spec_.relayReleased) job->cancelRelay();
      }
      total_ = job->bytesTotal();
      try {
        job->run([this, job] { report(job->bytesDone(), job->bytesTotal()); });
      } catch (...) {
        stats_ = job->stats();
        throw;
      }
      stats_ = job->stats();
    });
    if (error_) SetError(error_->what());
    auto teardown = std::chrono::steady_clock::now();
    // Streams synchronised, the ring freed and imported memory unmapped before the promise settles.
    {
      std::lock_guard<std::mutex> l(control_->mutex);
      control_->job.reset();
      control_->backend.reset();
    }
    spec_.targets.clear();
    spec_.buffers.clear();
    auto end = std::chrono::steady_clock::now();
    teardownSeconds_ = std::chrono::duration<double>(end - teardown).count();
    seconds_ = std::chrono::duration<double>(end - start).count();
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    releaseProgress();
    Napi::Object r = Napi::Object::New(env);
    r.Set("bytes", static_cast<double>(total_));
    r.Set("seconds", seconds_);
    r.Set("setupSeconds", setupSeconds_);
    r.Set("teardownSeconds", teardownSeconds_);
    auto timeline = [&](const transfer::PathTimeline& t) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("firstStart", t.firstStart);
      o.Set("lastEnd", t.lastEnd);
      o.Set("busySeconds", t.busySeconds);
      o.Set("maxInFlight", t.maxInFlight);
      return o;
    };
    r.Set("direct", timeline(stats_.direct));
    r.Set("relay", timeline(stats_.relay));
    r.Set("bytesDirect", static_cast<double>(stats_.bytesDirect));
    r.Set("bytesRelay", static_cast<double>(stats_.bytesRelay));
    r.Set("chunksDirect", stats_.chunksDirect);
    r.Set("chunksRelay", stats_.chunksRelay);
    r.Set("requeued", stats_.requeued);
    r.Set("maxRelayInFlight", stats_.maxRelayInFlight);
    r.Set("relayUsed", stats_.relayUsed);
    r.Set("relayCancelled", stats_.relayCancelled);
    r.Set("relayError", stats_.relayError);
    deferred_.Resolve(r);
  }

  void OnError(const Napi::Error&) override {
    Napi::HandleScope scope(Env());
    releaseProgress();
    Napi::Error e = toJsError(Env(), *error_);
    Napi::Object d = Napi::Object::New(Env());
    d.Set("bytesDirect", static_cast<double>(stats_.bytesDirect));
    d.Set("bytesRelay", static_cast<double>(stats_.bytesRelay));
    d.Set("requeued", stats_.requeued);
    d.Set("relayError", stats_.relayError);
    e.Value().Set("multipath", d);
    deferred_.Reject(e.Value());
  }

  void OnWorkComplete(Napi::Env env, napi_status status) override {
    if (lifecycle_->stopping()) {
      Destroy();
      return;
    }
    Napi::AsyncWorker::OnWorkComplete(env, status);
  }

 private:
  struct Update {
    uint64_t done, total;
  };
  void report(uint64_t done, uint64_t total) {
    if (!hasProgress_) return;
    auto* u = new Update{done, total};
    napi_status s = progress_.NonBlockingCall(u, [lifecycle = lifecycle_](Napi::Env env, Napi::Function fn, Update* u) {
      if (env != nullptr && fn != nullptr && !lifecycle->stopping()) {
        fn.Call({Napi::Number::New(env, static_cast<double>(u->done)), Napi::Number::New(env, static_cast<double>(u->total))});
      }
      delete u;
    });
    if (s != napi_ok) delete u;
  }
  void releaseProgress() {
    if (hasProgress_) {
      progress_.Release();
      hasProgress_ = false;
    }
  }

  Napi::Promise::Deferred deferred_;
  Spec spec_;
  std::shared_ptr<Lifecycle> lifecycle_;
  std::shared_ptr<Control> control_;
  Napi::ThreadSafeFunction progress_;
  bool hasProgress_ = false;
  std::optional<NativeError> error_;
  transfer::MultipathStats stats_;
  uint64_t total_ = 0;
  double seconds_ = 0;
  double setupSeconds_ = 0;     // backend built: mappings, streams, the neighbour's ring
  double teardownSeconds_ = 0;  // backend destroyed: streams drained, ring freed
};

Napi::Value StartMultipath(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "startMultipath needs a spec object"));
  Spec spec = parseSpec(env, info[0].As<Napi::Object>());
  auto* worker = new MultipathWorker(env, std::move(spec), info[1]);
  auto control = worker->control();
  Napi::Object handle = Napi::Object::New(env);
  handle.Set("promise", worker->promise());
  handle.Set("cancel", Napi::Function::New(env, [control](const Napi::CallbackInfo& ci) -> Napi::Value {
    control->cancel();
    return ci.Env().Undefined();
  }, "cancel"));
  handle.Set("cancelRelay", Napi::Function::New(env, [control](const Napi::CallbackInfo& ci) -> Napi::Value {
    control->cancelRelay();
    return ci.Env().Undefined();
  }, "cancelRelay"));
  handle.Set("ringBytes", Napi::Function::New(env, [control](const Napi::CallbackInfo& ci) -> Napi::Value {
    return Napi::Number::New(ci.Env(), static_cast<double>(control->ringBytes()));
  }, "ringBytes"));
  worker->Queue();
  return handle;
}

}  // namespace

void initMultipath(Napi::Env env, Napi::Object exports) {
  exports.Set("startMultipath", Napi::Function::New(env, StartMultipath, "startMultipath"));
  exports.Set("releaseWarmNeighbours", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    transfer::releaseWarmNeighbours();
    return info.Env().Undefined();
  }, "releaseWarmNeighbours"));
}

}  // namespace vsnap::js
