// openCopyQueue(label, chunkSize, onProgress?) -> CopyQueue: copies RAM-tier bytes into regions in
// the order batches are pushed (transfer/copy_queue.h), off the JS thread.
//   push([{ name, size, memory: Memory, source: { kind: 'buffer', buffer, offset } }])
//     -> Promise<{ id, bytes, copies, issuedAt, landedAt, devices: [{ device, bytes }] }>: settles once the
//        batch's last byte landed (issuedAt / landedAt: seconds since the queue opened)
//   close() -> Promise<void>: no more batches; resolves once every batch settled and the threads ended
//   cancel(): stops at the next chunk; the batches left reject with E_ABORTED
//   bytesLanded: bytes landed so far
// onProgress(landed) is called as the bytes land (about every 256 MiB). An idle queue does not keep
// the event loop alive; one with a batch in flight does.
#include <map>
#include <variant>

#include "js/js_memory.h"
#include "js/js_util.h"
#include "transfer/copy_queue.h"

namespace vsnap::js {
namespace {

constexpr uint64_t kDefaultChunk = 64ull << 20;

using QueueEvent = std::variant<transfer::BatchOutcome, uint64_t>;

// What the JS thread keeps of a queue; shared with the thread-safe function's calls, so a call
// still queued when the wrapper goes finds it alive.
struct QueueState {
  std::map<uint64_t, Napi::Promise::Deferred> pending;
  Napi::FunctionReference onProgress;
  Napi::ThreadSafeFunction events;
  bool referenced = false;
  bool released = false;

  // Keeps the event loop alive exactly while a batch is pending.
  void reference(Napi::Env env) {
    bool want = !pending.empty();
    if (released || want == referenced) return;
    if (want) events.Ref(env);
    else events.Unref(env);
    referenced = want;
  }
  void release() {
    if (released) return;
    released = true;
    events.Release();
  }
};

Napi::Object outcomeObject(Napi::Env env, const transfer::BatchOutcome& o) {
  Napi::Object result = Napi::Object::New(env);
  result.Set("id", static_cast<double>(o.id));
  result.Set("bytes", static_cast<double>(o.bytes));
  result.Set("issuedAt", o.issuedAt);
  result.Set("landedAt", o.landedAt);
  result.Set("copies", static_cast<double>(o.copies));
  Napi::Array devices = Napi::Array::New(env);
  uint32_t n = 0;
  for (auto& [device, bytes] : o.deviceBytes) {
    Napi::Object d = Napi::Object::New(env);
    d.Set("device", device);
    d.Set("bytes", static_cast<double>(bytes));
    devices.Set(n++, d);
  }
  result.Set("devices", devices);
  return result;
}

class CopyQueueWrap : public Napi::ObjectWrap<CopyQueueWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "CopyQueue",
                       {InstanceMethod<&CopyQueueWrap::Push>("push"), InstanceMethod<&CopyQueueWrap::Close>("close"),
                        InstanceMethod<&CopyQueueWrap::Cancel>("cancel"),
                        InstanceAccessor<&CopyQueueWrap::BytesLanded>("bytesLanded")});
  }

  CopyQueueWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CopyQueueWrap>(info) {
    Napi::Env env = info.Env();
    std::string label = toString(info[0], "label");
    uint64_t chunk = info.Length() > 1 && !info[1].IsUndefined() ? toU64(info[1], "chunkSize") : kDefaultChunk;
    if (chunk == 0) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "chunkSize must be above 0"));
    state_ = std::make_shared<QueueState>();
    if (info.Length() > 2 && info[2].IsFunction()) state_->onProgress = Napi::Persistent(info[2].As<Napi::Function>());
    state_->events = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}), "vsnap-copy-queue", 0, 1);
    state_->events.Unref(env);
    lifecycle_ = addonData(env).lifecycle;
    auto post = [state = state_, lifecycle = lifecycle_](QueueEvent&& e) {
      auto* boxed = new QueueEvent(std::move(e));
      napi_status s = state->events.NonBlockingCall(boxed, [state, lifecycle](Napi::Env env, Napi::Function, QueueEvent* ev) {
        std::unique_ptr<QueueEvent> owned(ev);
        if (env == nullptr || lifecycle->stopping()) return;
        Napi::HandleScope scope(env);
        if (auto* landed = std::get_if<uint64_t>(ev)) {
          if (!state->onProgress.IsEmpty()) state->onProgress.Call({Napi::Number::New(env, static_cast<double>(*landed))});
          return;
        }
        auto& outcome = std::get<transfer::BatchOutcome>(*ev);
        auto it = state->pending.find(outcome.id);
        if (it == state->pending.end()) return;
        Napi::Promise::Deferred deferred = it->second;
        state->pending.erase(it);
        state->reference(env);
        if (outcome.error) deferred.Reject(toJsError(env, *outcome.error).Value());
        else deferred.Resolve(outcomeObject(env, outcome));
      });
      if (s != napi_ok) delete boxed;
    };
    try {
      queue_ = std::make_shared<transfer::CopyQueue>(
          label, chunk, [post](const transfer::BatchOutcome& o) { post(QueueEvent(o)); },
          [post](uint64_t landed) { post(QueueEvent(landed)); });
    } catch (const NativeError& e) {
      state_->release();
      throw toJsError(env, e);
    }
    std::weak_ptr<transfer::CopyQueue> weak = queue_;
    auto stop = [weak] {
      if (auto q = weak.lock()) {
        q->cancel();
        q->join();
      }
    };
    lifecycle_->add(this, stop);       // cancelled and waited for when the environment goes,
    Lifecycle::addAtExit(this, stop);  // and at process.exit(), which runs no cleanup hook
  }

  ~CopyQueueWrap() override {
    Lifecycle::removeAtExit(this);
    lifecycle_->remove(this);
    if (queue_) {
      queue_->cancel();
      queue_->join();
    }
    if (state_) state_->release();
  }

 private:
  Napi::Value Push(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!queue_ || closing_) throw toJsError(env, NativeError("E_CLOSED", "this copy queue is closed"));
    if (!info[0].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "push needs an array of regions"));
    Napi::Array list = info[0].As<Napi::Array>();
    std::vector<transfer::CopyItem> items;
    for (uint32_t i = 0; i < list.Length(); i++) {
      Napi::Value v = list.Get(i);
      if (!v.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "regions[" + std::to_string(i) + "] must be an object"));
      Napi::Object r = v.As<Napi::Object>();
      transfer::CopyItem item;
      item.name = toString(getRequired(r, "name"), "region name");
      item.size = toU64(getRequired(r, "size"), "size");
      auto target = std::make_shared<MemorySpec>(parseMemory(env, getRequired(r, "memory")));
      auto source = std::make_shared<MemorySpec>(parseMemory(env, getRequired(r, "source")));
      if (source->kind != MemorySpec::Kind::Buffer) {
        throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "region '" + item.name + "': the source must be a HostBuffer slice"));
      }
      uint64_t size = item.size;
      item.target = [target, size] { return target->open(size); };
      item.source = [source, size] { return source->open(size); };
      items.push_back(std::move(item));
    }
    uint64_t id = guard(env, [&] { return queue_->push(std::move(items)); });
    Napi::Promise::Deferred deferred = Napi::Promise::Deferred::New(env);
    state_->pending.emplace(id, deferred);
    state_->reference(env);
    return deferred.Promise();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!queue_) return resolved(env);
    closing_ = true;
    queue_->close();
    auto queue = queue_;
    auto state = state_;
    return PromiseWorker<bool>::Run(
        env, [queue] { queue->join(); return true; },
        [state](Napi::Env e, bool&) -> Napi::Value {
          state->release();  // every call is queued by now: they are still delivered
          return e.Undefined();
        });
  }

  Napi::Value Cancel(const Napi::CallbackInfo& info) {
    if (queue_) queue_->cancel();
    return info.Env().Undefined();
  }

  Napi::Value BytesLanded(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), queue_ ? static_cast<double>(queue_->bytesLanded()) : 0);
  }

  static Napi::Value resolved(Napi::Env env) {
    Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
    d.Resolve(env.Undefined());
    return d.Promise();
  }

  std::shared_ptr<transfer::CopyQueue> queue_;
  std::shared_ptr<QueueState> state_;
  std::shared_ptr<Lifecycle> lifecycle_;
  bool closing_ = false;
};

}  // namespace

void initCopyQueue(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = CopyQueueWrap::Define(env);
  exports.Set("CopyQueue", ctor);
}

}  // namespace vsnap::js
