// FdListener(path, onEvent, peerDeadlineMs?): a unix socket receiving descriptors from peers
// (see ipc/fd_channel.h for the protocol); sendFds(): the client side, off the JS thread.
#include <fcntl.h>

#include <variant>

#include "common/fd.h"
#include "ipc/fd_channel.h"
#include "js/js_util.h"

namespace vsnap::js {
namespace {

struct Rejection {
  std::string reason;
  pid_t pid;
};
using Event = std::variant<ipc::Delivery, Rejection>;

class FdListener : public Napi::ObjectWrap<FdListener> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "FdListener",
                       {InstanceAccessor<&FdListener::Path>("path"), InstanceMethod<&FdListener::Expect>("expect"),
                        InstanceMethod<&FdListener::Forget>("forget"), InstanceMethod<&FdListener::Ref>("ref"),
                        InstanceMethod<&FdListener::Unref>("unref"), InstanceMethod<&FdListener::Close>("close")});
  }

  FdListener(const Napi::CallbackInfo& info) : Napi::ObjectWrap<FdListener>(info) {
    Napi::Env env = info.Env();
    std::string path = toString(info[0], "path");
    if (!info[1].IsFunction()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "FdListener(path, onEvent)"));
    int deadlineMs = info.Length() > 2 && info[2].IsNumber() ? static_cast<int>(toI64(info[2], "peerDeadlineMs"))
                                                             : ipc::kPeerDeadlineMs;
    events_ = Napi::ThreadSafeFunction::New(env, info[1].As<Napi::Function>(), "vsnap-fd-listener", 0, 1);
    lifecycle_ = addonData(env).lifecycle;
    auto post = [this, lifecycle = lifecycle_](Event&& e) {
      auto* boxed = new Event(std::move(e));
      napi_status s = events_.BlockingCall(boxed, [lifecycle](Napi::Env env, Napi::Function onEvent, Event* ev) {
        deliver(lifecycle->stopping() ? Napi::Env(nullptr) : env, onEvent, ev);
      });
      if (s != napi_ok) {
        if (auto* d = std::get_if<ipc::Delivery>(boxed)) for (int fd : d->fds) ::close(fd);
        delete boxed;
      }
    };
    try {
      listener_ = std::make_unique<ipc::FdListener>(
          path, [post](ipc::Delivery&& d) { post(Event(std::move(d))); },
          [post](const std::string& reason, pid_t pid) { post(Event(Rejection{reason, pid})); }, deadlineMs);
    } catch (const NativeError& e) {
      events_.Release();
      throw toJsError(env, e);
    }
    lifecycle_->add(this, [this] { stop(); });  // closed when the environment goes
    ipc::FdListener* raw = listener_.get();
    Lifecycle::addAtExit(this, [raw] { raw->close(); });  // socket file and offers, at process.exit()
  }

  ~FdListener() override {
    lifecycle_->remove(this);
    stop();
  }

 private:
  // Runs on the JS thread: onEvent({type:'delivery', nonce, header, fds, pid}) or
  // onEvent({type:'reject', reason, pid}). The handler owns delivered fds from then on.
  static void deliver(Napi::Env env, Napi::Function onEvent, Event* ev) {
    std::unique_ptr<Event> owned(ev);
    auto* d = std::get_if<ipc::Delivery>(ev);
    if (env == nullptr) {  // the environment is going away: no JS to hand the descriptors to
      if (d) for (int fd : d->fds) ::close(fd);
      return;
    }
    Napi::Object event = Napi::Object::New(env);
    if (d) {
      Napi::Array fds = Napi::Array::New(env, d->fds.size());
      for (size_t i = 0; i < d->fds.size(); i++) fds.Set(i, d->fds[i]);
      event.Set("type", "delivery");
      event.Set("nonce", d->nonce);
      event.Set("header", d->header);
      event.Set("fds", fds);
      event.Set("pid", d->pid);
    } else {
      auto& r = std::get<Rejection>(*ev);
      event.Set("type", "reject");
      event.Set("reason", r.reason);
      event.Set("pid", r.pid);
    }
    onEvent.Call({event});
  }

  void stop() {
    if (listener_) {
      Lifecycle::removeAtExit(this);
      listener_->close();  // joins the accept thread: no event is posted after this
      listener_.reset();
      events_.Release();
    }
  }

  ipc::FdListener& live(Napi::Env env) {
    if (!listener_) throw toJsError(env, NativeError("E_CLOSED", "this FdListener was closed"));
    return *listener_;
  }

  Napi::Value Path(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), live(info.Env()).path()); }
  // expect(nonce, offerHeader?, offerFds?): the offered fds are duplicated now, so the caller
  // may close theirs at once.
  Napi::Value Expect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    std::string nonce = toString(info[0], "nonce");
    std::string offer = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : std::string();
    std::vector<int> fds;
    if (info.Length() > 2 && info[2].IsArray()) {
      Napi::Array arr = info[2].As<Napi::Array>();
      for (uint32_t i = 0; i < arr.Length(); i++) {
        int fd = static_cast<int>(toI64(arr.Get(i), "fd"));
        int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) {
          for (int f : fds) ::close(f);
          throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "offered fd " + std::to_string(fd) + " is not open"));
        }
        fds.push_back(copy);
      }
    }
    guard(env, [&] { live(env).expect(nonce, offer, std::move(fds)); });
    return env.Undefined();
  }
  Napi::Value Forget(const Napi::CallbackInfo& info) {
    live(info.Env()).forget(toString(info[0], "nonce"));
    return info.Env().Undefined();
  }
  Napi::Value Ref(const Napi::CallbackInfo& info) {
    if (listener_) events_.Ref(info.Env());
    return info.Env().Undefined();
  }
  Napi::Value Unref(const Napi::CallbackInfo& info) {
    if (listener_) events_.Unref(info.Env());
    return info.Env().Undefined();
  }
  Napi::Value Close(const Napi::CallbackInfo& info) {
    stop();
    return info.Env().Undefined();
  }

  std::unique_ptr<ipc::FdListener> listener_;
  Napi::ThreadSafeFunction events_;
  std::shared_ptr<Lifecycle> lifecycle_;
};

Napi::Value SendFds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = toString(info[0], "path");
  std::string nonce = toString(info[1], "nonce");
  std::string header = toString(info[2], "header");
  if (!info[3].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "fds must be an array"));
  Napi::Array arr = info[3].As<Napi::Array>();
  int timeoutMs = info[4].IsNumber() ? static_cast<int>(toI64(info[4], "timeoutMs")) : 10000;
  auto owned = std::make_shared<std::vector<UniqueFd>>();
  for (uint32_t i = 0; i < arr.Length(); i++) {
    int fd = static_cast<int>(toI64(arr.Get(i), "fd"));
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "fd " + std::to_string(fd) + " is not open"));
    owned->emplace_back(copy);
  }
  return PromiseWorker<ipc::Reply>::Run(
      env,
      [=] {
        std::vector<int> fds;
        for (auto& f : *owned) fds.push_back(f.get());
        ipc::Reply reply = ipc::sendFds(path, nonce, header, fds, timeoutMs);
        owned->clear();
        return reply;
      },
      [](Napi::Env e, ipc::Reply& reply) -> Napi::Value {
        Napi::Object out = Napi::Object::New(e);
        out.Set("reply", reply.json);
        Napi::Array fds = Napi::Array::New(e, reply.fds.size());
        for (size_t i = 0; i < reply.fds.size(); i++) fds.Set(i, reply.fds[i]);
        out.Set("fds", fds);
        return out;
      });
}

}  // namespace

void initFdListener(Napi::Env env, Napi::Object exports) {
  exports.Set("FdListener", FdListener::Define(env));
  exports.Set("sendFds", Napi::Function::New(env, SendFds, "sendFds"));
}

}  // namespace vsnap::js
