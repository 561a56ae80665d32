// Passing file descriptors between processes over a unix socket.
//
// Wire protocol (SOCK_STREAM, little-endian integers), client to server:
//   "VSN1"                       4 bytes, magic and version
//   nonce                        64 ASCII hex digits, issued by the receiver for this transfer
//   header length H, fd count N  u32, u32 (H <= 64 MiB, N <= 65536)
//   header                       H bytes of UTF-8 JSON (opaque here)
//   ceil(N / 250) fd batches     each one byte 'F' carrying up to 250 descriptors (SCM_RIGHTS)
// then server to client: u32 length + JSON {"ok":true} or {"ok":false,"code":"E_...","error":"..."}.
// When the receiver registered an offer for the nonce, the reply is
// {"ok":true,"offer":<its JSON header>,"fds":M} followed by M descriptors in the same one-byte
// 'F' batches: a peer can fetch descriptors as well as send them (tier-0 wakes use this).
// Descriptors travel only on the one-byte batch frames, so no read ever merges two batches.
//
// The listener accepts only peers with this process's uid (SO_PEERCRED) that present a nonce
// it was told to expect; each nonce is accepted once; a header that is not a JSON object is
// refused. The socket file has mode 0600. Connections are served concurrently (at most
// kMaxConnections at once, one thread each), each within kPeerDeadlineMs from accept to reply:
// an idle or slow peer holds up only itself.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "ipc/wire.h"

namespace vsnap::ipc {

constexpr size_t kNonceLength = 64;
constexpr uint32_t kMaxHeaderBytes = 64u << 20;
constexpr uint32_t kMaxFds = 65536;
constexpr int kPeerDeadlineMs = 10000;
constexpr size_t kMaxConnections = 32;

struct Delivery {
  std::string nonce;
  std::string header;
  std::vector<int> fds;  // owned by the receiver of the delivery
  pid_t pid = 0;
  uid_t uid = 0;
};

class FdListener {
 public:
  using OnDelivery = std::function<void(Delivery&&)>;
  using OnReject = std::function<void(const std::string& reason, pid_t pid)>;

  // peerDeadlineMs: how long one connection may take from accept to its reply.
  FdListener(const std::string& path, OnDelivery onDelivery, OnReject onReject, int peerDeadlineMs = kPeerDeadlineMs);
  ~FdListener();
  FdListener(const FdListener&) = delete;
  FdListener& operator=(const FdListener&) = delete;

  const std::string& path() const { return path_; }
  // Authorises one message with `nonce`; the peer that presents it gets `offerHeader` and the
  // offered descriptors (the listener's own duplicates, closed once sent or forgotten).
  void expect(const std::string& nonce, const std::string& offerHeader = "", std::vector<int> offerFds = {});
  void forget(const std::string& nonce);
  // Stops accepting, cuts every connection short, joins every thread, closes the descriptors
  // of offers nobody fetched and removes the socket file.
  void close();

 private:
  struct Connection {
    UniqueFd fd;
    std::thread thread;
    bool done = false;
  };
  void loop();
  void start(UniqueFd conn);
  void reap(bool all);
  void handle(int conn);
  struct Offer {
    std::string header;  // empty: nothing offered
    std::vector<int> fds;
  };
  bool takeNonce(const std::string& nonce, Offer& offer);

  std::string path_;
  OnDelivery onDelivery_;
  OnReject onReject_;
  int peerDeadlineMs_;
  UniqueFd listen_;
  UniqueFd wake_;
  std::thread thread_;
  std::mutex mutex_;
  std::map<std::string, Offer> expected_;
  std::mutex connectionsMutex_;
  std::list<Connection> connections_;  // guarded by connectionsMutex_
  std::atomic<bool> closed_{false};
};

// Client side: sends header + fds; returns the server's JSON reply and any descriptors it offered
// (the caller owns them). Blocking.
struct Reply {
  std::string json;
  std::vector<int> fds;
};
Reply sendFds(const std::string& path, const std::string& nonce, const std::string& header,
              const std::vector<int>& fds, int timeoutMs);

}  // namespace vsnap::ipc
