// startTransfer(spec, onProgress) -> { promise, cancel }: runs one TransferJob off the JS
// thread, reports progress through a thread-safe function, and cancels between chunks.
//
// spec: { op: 'capture'|'hydrate'|'verify'|'copy', label, pool?: StagingPool, threads?, directIo?,
//         verifyFirst?, hash? (capture: false lands the bytes in the hostCopy unhashed),
//         digest? (capture: true also returns digests[region][chunk], "vsnap-gd1"), regions: [{ name, blobPath?, size, chunkSize, checksums?: string[],
//         memory?: Memory, hostCopy?: Memory (a 'buffer': copy reads it; capture fills it,
//         and then needs no blobPath) }] }
// Memory: { kind: 'host', fd } | { kind: 'imported', fd } | { kind: 'device', allocation }
//       | { kind: 'buffer', buffer: HostBuffer, offset } | { kind: 'mapped', set: RegionSet, index }
#include <fcntl.h>

#include <chrono>

#include "common/fd.h"
#include "cuda/vmm.h"
#include "js/js_allocation.h"
#include "js/js_host_buffer.h"
#include "js/js_memory.h"
#include "js/js_region_set.h"
#include "js/js_staging_pool.h"
#include "js/js_util.h"
#include "transfer/engine.h"
#include "transfer/host_buffer.h"
#include "transfer/region_set.h"
#include "js/parallel.h"

namespace vsnap::js {
namespace {

constexpr size_t kOpenThreads = 8;  // threads that map (and unmap) a job's regions

struct ProgressUpdate {
  uint64_t done;
  uint64_t total;
  transfer::Phase phase;
};

transfer::Operation parseOp(Napi::Env env, const std::string& op) {
  if (op == "capture") return transfer::Operation::Capture;
  if (op == "hydrate") return transfer::Operation::Hydrate;
  if (op == "verify") return transfer::Operation::Verify;
  if (op == "copy") return transfer::Operation::Copy;
  throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "op must be 'capture', 'hydrate', 'verify' or 'copy'"));
}

class TransferWorker : public Napi::AsyncWorker {
 public:
  TransferWorker(Napi::Env env, transfer::JobOptions options, std::vector<transfer::RegionTask> tasks,
                 std::vector<MemorySpec> memory, std::vector<MemorySpec> hostCopies,
                 std::shared_ptr<transfer::StagingPool> pool, Napi::Value onProgress)
      : Napi::AsyncWorker(env, "vsnap-transfer"),
        deferred_(Napi::Promise::Deferred::New(env)),
        op_(options.op),
        digests_(options.digestChunks),
        memory_(std::move(memory)),
        hostCopies_(std::move(hostCopies)),
        job_(std::make_shared<transfer::TransferJob>(std::move(options), std::move(tasks), std::move(pool))),
        lifecycle_(addonData(env).lifecycle),
        running_(std::make_shared<RunningJob>(job_)) {
    lifecycle_->add(running_);  // cancelled and waited for if the environment goes first
    if (onProgress.IsFunction()) {
      progress_ = Napi::ThreadSafeFunction::New(env, onProgress.As<Napi::Function>(), "vsnap-progress", 0, 1);
      hasProgress_ = true;
    }
  }

  Napi::Promise promise() { return deferred_.Promise(); }
  std::shared_ptr<transfer::TransferJob> job() { return job_; }

 protected:
  void Execute() override {
    auto start = std::chrono::steady_clock::now();
    error_ = captureError([this] {
      auto& tasks = job_->tasks();
      // Imported regions are mapped (and unmapped below) several at once: a TP engine's
      // hundreds of regions cost ~0.1 ms each to import and map one after the other.
      parallelFor(tasks.size(), kOpenThreads, [&](size_t i) {
        tasks[i].region = memory_[i].open(tasks[i].size);
        tasks[i].hostCopy = hostCopies_[i].open(tasks[i].size);
      });
      job_->run([this] { report(); });
    });
    if (error_) SetError(error_->what());
    // Unmap imported memory and drop our descriptors before the promise settles.
    auto& tasks = job_->tasks();
    try {
      parallelFor(tasks.size(), kOpenThreads, [&](size_t i) {
        tasks[i].region.reset();
        tasks[i].hostCopy.reset();
      });
    } catch (...) {  // destructors do not throw; a thread that cannot start leaves work to this one
    }
    for (auto& t : tasks) {
      t.region.reset();
      t.hostCopy.reset();
    }
    memory_.clear();
    hostCopies_.clear();
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    running_->finished();
    lifecycle_->remove(running_);
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    releaseProgress();
    Napi::Object result = Napi::Object::New(env);
    result.Set("bytes", static_cast<double>(job_->bytesTotal()));
    result.Set("seconds", seconds_);
    Napi::Array devices = Napi::Array::New(env);
    uint32_t n = 0;
    for (auto& [device, stat] : job_->deviceStats()) {
      Napi::Object d = Napi::Object::New(env);
      d.Set("device", device);
      d.Set("bytes", static_cast<double>(stat.bytes));
      d.Set("seconds", stat.seconds);
      devices.Set(n++, d);
    }
    result.Set("devices", devices);
    if (op_ == transfer::Operation::Capture) {
      Napi::Array regions = Napi::Array::New(env);
      auto& tasks = job_->tasks();
      for (size_t i = 0; i < tasks.size(); i++) {
        Napi::Array sums = Napi::Array::New(env, tasks[i].checksums.size());
        for (size_t c = 0; c < tasks[i].checksums.size(); c++) sums.Set(c, tasks[i].checksums[c].hex());
        regions.Set(i, sums);
      }
      result.Set("checksums", regions);
      if (digests_) {
        Napi::Array digests = Napi::Array::New(env);
        for (size_t i = 0; i < tasks.size(); i++) {
          Napi::Array chunks = Napi::Array::New(env, tasks[i].digests.size());
          for (size_t c = 0; c < tasks[i].digests.size(); c++) chunks.Set(c, tasks[i].digests[c].hex());
          digests.Set(i, chunks);
        }
        result.Set("digests", digests);
      }
    }
    deferred_.Resolve(result);
  }

  void OnError(const Napi::Error&) override {
    Napi::HandleScope scope(Env());
    releaseProgress();
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
  void report() {
    if (!hasProgress_) return;
    auto* update = new ProgressUpdate{job_->bytesDone(), job_->bytesTotal(), job_->phase()};
    napi_status s = progress_.NonBlockingCall(update, [lifecycle = lifecycle_](Napi::Env env, Napi::Function fn, ProgressUpdate* u) {
      if (env != nullptr && fn != nullptr && !lifecycle->stopping()) {
        fn.Call({Napi::Number::New(env, static_cast<double>(u->done)), Napi::Number::New(env, static_cast<double>(u->total)),
                 Napi::String::New(env, transfer::phaseName(u->phase))});
      }
      delete u;
    });
    if (s != napi_ok) delete update;
  }

  void releaseProgress() {
    if (hasProgress_) {
      progress_.Release();
      hasProgress_ = false;
    }
  }

  Napi::Promise::Deferred deferred_;
  transfer::Operation op_;
  bool digests_;
  std::vector<MemorySpec> memory_;
  std::vector<MemorySpec> hostCopies_;
  std::shared_ptr<transfer::TransferJob> job_;
  std::shared_ptr<Lifecycle> lifecycle_;
  std::shared_ptr<RunningJob> running_;
  Napi::ThreadSafeFunction progress_;
  bool hasProgress_ = false;
  std::optional<NativeError> error_;
  double seconds_ = 0;
};

Napi::Value StartTransfer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "startTransfer needs a spec object"));
  Napi::Object spec = info[0].As<Napi::Object>();
  transfer::JobOptions options;
  options.op = parseOp(env, toString(getRequired(spec, "op"), "op"));
  options.label = spec.Has("label") ? toString(spec.Get("label"), "label") : std::string();
  if (spec.Has("threads") && !spec.Get("threads").IsUndefined()) options.threads = static_cast<uint32_t>(toU64(spec.Get("threads"), "threads"));
  options.directIo = spec.Get("directIo").ToBoolean().Value();
  options.verifyFirst = spec.Get("verifyFirst").ToBoolean().Value();
  // capture: `hash: false` defers the chunk hashes (the bytes only land in the hostCopy).
  if (spec.Has("hash") && !spec.Get("hash").IsUndefined()) options.hashChunks = spec.Get("hash").ToBoolean().Value();
  // capture: `digest: true` also takes every chunk's GPU digest, from the same read as its hash.
  options.digestChunks = spec.Get("digest").ToBoolean().Value();
  // Optional: a pass whose regions are all RAM-tier memory on one side needs no staging (the
  // job says so when one is missing and needed).
  std::shared_ptr<transfer::StagingPool> pool;
  if (spec.Has("pool") && !spec.Get("pool").IsUndefined()) pool = StagingPool::unwrap(spec.Get("pool"));

  Napi::Value regionsValue = getRequired(spec, "regions");
  if (!regionsValue.IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "regions must be an array"));
  Napi::Array regions = regionsValue.As<Napi::Array>();
  std::vector<transfer::RegionTask> tasks;
  std::vector<MemorySpec> memory;
  std::vector<MemorySpec> hostCopies;
  for (uint32_t i = 0; i < regions.Length(); i++) {
    Napi::Value rv = regions.Get(i);
    if (!rv.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "regions[" + std::to_string(i) + "] must be an object"));
    Napi::Object r = rv.As<Napi::Object>();
    transfer::RegionTask task;
    task.name = toString(getRequired(r, "name"), "region name");
    task.blobPath = r.Has("blobPath") ? toString(r.Get("blobPath"), "blobPath") : std::string();
    hostCopies.push_back(parseMemory(env, r.Get("hostCopy")));
    bool hasHostCopy = hostCopies.back().kind != MemorySpec::Kind::None;
    if (hasHostCopy && hostCopies.back().kind != MemorySpec::Kind::Buffer) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "region '" + task.name + "': hostCopy must be a HostBuffer slice"));
    }
    bool blobOptional = options.op == transfer::Operation::Copy || (options.op == transfer::Operation::Capture && hasHostCopy);
    if (task.blobPath.empty() && !blobOptional) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "region '" + task.name + "' needs a blobPath"));
    }
    if (options.op == transfer::Operation::Copy && !hasHostCopy) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "region '" + task.name + "': copy reads from a hostCopy"));
    }
    task.size = toU64(getRequired(r, "size"), "size");
    task.chunkSize = toU64(getRequired(r, "chunkSize"), "chunkSize");
    Napi::Value sums = r.Get("checksums");
    if (sums.IsArray()) {
      Napi::Array arr = sums.As<Napi::Array>();
      for (uint32_t c = 0; c < arr.Length(); c++) {
        std::string hex = toString(arr.Get(c), "checksum");
        task.expected.push_back(guard(env, [&] { return hash::Digest::fromHex(hex); }));
      }
    }
    memory.push_back(parseMemory(env, r.Get("memory")));
    if (options.op != transfer::Operation::Verify && memory.back().kind == MemorySpec::Kind::None) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "region '" + task.name + "' needs memory for " +
                                                                 (options.op == transfer::Operation::Capture ? "capture" : "a copy or hydrate")));
    }
    tasks.push_back(std::move(task));
  }

  auto* worker = new TransferWorker(env, std::move(options), std::move(tasks), std::move(memory), std::move(hostCopies),
                                    std::move(pool), info[1]);
  Napi::Object handle = Napi::Object::New(env);
  handle.Set("promise", worker->promise());
  std::weak_ptr<transfer::TransferJob> weak = worker->job();
  handle.Set("cancel", Napi::Function::New(env, [weak](const Napi::CallbackInfo& ci) -> Napi::Value {
    if (auto job = weak.lock()) job->cancel();
    return ci.Env().Undefined();
  }, "cancel"));
  worker->Queue();
  return handle;
}

}  // namespace

void initTransfer(Napi::Env env, Napi::Object exports) {
  exports.Set("startTransfer", Napi::Function::New(env, StartTransfer, "startTransfer"));
}

}  // namespace vsnap::js
