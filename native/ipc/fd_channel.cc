#include "ipc/fd_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "ipc/json_syntax.h"

namespace vsnap::ipc {
namespace {

constexpr char kMagic[4] = {'V', 'S', 'N', '1'};

sockaddr_un address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    throwInvalid("unix socket path must be 1.." + std::to_string(sizeof addr.sun_path - 1) +
                 " bytes long: '" + path + "'");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

void reply(int fd, const std::string& json) {
  std::string frame;
  putU32(frame, static_cast<uint32_t>(json.size()));
  frame += json;
  try {
    writeExact(fd, frame.data(), frame.size());
  } catch (const NativeError&) {
    // the peer is gone (or stopped reading): nothing to tell it
  }
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

FdListener::FdListener(const std::string& path, OnDelivery onDelivery, OnReject onReject, int peerDeadlineMs)
    : path_(path), onDelivery_(std::move(onDelivery)), onReject_(std::move(onReject)), peerDeadlineMs_(peerDeadlineMs) {
  if (peerDeadlineMs < 1) throwInvalid("the peer deadline must be at least 1 ms");
  sockaddr_un addr = address(path);
  listen_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_.valid()) throwSystemError("socket", path, errno);
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) throwInvalid("'" + path + "' exists and is not a socket");
    // A socket file nobody listens on is left over from a dead process: replace it.
    UniqueFd probe(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      throw NativeError("E_ADDRESS_IN_USE", "another process is listening on '" + path + "'", {{"path", path}});
    }
    ::unlink(path.c_str());
  }
  if (bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throwSystemError("bind", path, errno);
  // No peer can connect before listen(), so tightening the mode here leaves no window.
  if (chmod(path.c_str(), 0600) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    throwSystemError("chmod", path, err);
  }
  if (listen(listen_.get(), 64) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    throwSystemError("listen", path, err);
  }
  wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) throwSystemError("eventfd", "", errno);
  thread_ = std::thread([this] { loop(); });
}

FdListener::~FdListener() { close(); }

void FdListener::close() {
  if (closed_.exchange(true)) return;
  uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof one) < 0) {
    // cannot happen for a fresh eventfd; the threads still notice closed_ within a second
  }
  if (thread_.joinable()) thread_.join();
  reap(true);  // every connection waits on wake_ too, so each ends promptly
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [nonce, offer] : expected_) closeAll(offer.fds);
    expected_.clear();
  }
  ::unlink(path_.c_str());
  listen_.reset();
}

void FdListener::expect(const std::string& nonce, const std::string& offerHeader, std::vector<int> offerFds) {
  if (nonce.size() != kNonceLength) {
    closeAll(offerFds);
    throwInvalid("a nonce is 64 hex digits");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = expected_[nonce];
  closeAll(slot.fds);
  slot = Offer{offerHeader, std::move(offerFds)};
}

void FdListener::forget(const std::string& nonce) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = expected_.find(nonce);
  if (it == expected_.end()) return;
  closeAll(it->second.fds);
  expected_.erase(it);
}

bool FdListener::takeNonce(const std::string& nonce, Offer& offer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto match = expected_.end();
  for (auto it = expected_.begin(); it != expected_.end(); ++it) {  // compare with all, in constant time each
    if (constantTimeEqual(it->first, nonce)) match = it;
  }
  if (match == expected_.end()) return false;
  offer = std::move(match->second);
  expected_.erase(match);
  return true;
}

void FdListener::loop() {
  pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  while (!closed_) {
    int r = poll(fds, 2, 1000);
    reap(false);
    if (r < 0 && errno != EINTR) break;
    if (closed_ || (fds[1].revents & POLLIN)) break;
    if (!(fds[0].revents & POLLIN)) continue;
    int conn = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn >= 0) start(UniqueFd(conn));
  }
}

// One thread per connection, so a peer that stalls holds up only itself.
void FdListener::start(UniqueFd conn) {
  std::unique_lock<std::mutex> lock(connectionsMutex_);
  if (connections_.size() >= kMaxConnections) {
    lock.unlock();
    reply(conn.get(), "{\"ok\":false,\"code\":\"E_BUSY\",\"error\":\"too many connections at once; try again\"}");
    onReject_("refused a connection: " + std::to_string(kMaxConnections) + " already in progress", 0);
    return;
  }
  auto& entry = connections_.emplace_back();
  entry.fd = std::move(conn);
  auto self = std::prev(connections_.end());
  try {
    entry.thread = std::thread([this, self] {
      handle(self->fd.get());
      std::lock_guard<std::mutex> done(connectionsMutex_);
      self->fd.reset();
      self->done = true;
    });
  } catch (const std::system_error& e) {  // no thread to be had: refuse this peer, keep serving
    int fd = entry.fd.get();
    reply(fd, "{\"ok\":false,\"code\":\"E_BUSY\",\"error\":\"the receiver could not start a thread\"}");
    connections_.erase(self);
    lock.unlock();
    onReject_(std::string("could not start a connection thread: ") + e.what(), 0);
  }
}

void FdListener::reap(bool all) {
  std::list<Connection> finished;
  {
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (all || it->done) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (auto& c : finished) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void FdListener::handle(int conn) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    onReject_("could not read the peer's credentials", 0);
    return;
  }
  setTimeouts(conn, peerDeadlineMs_);  // bounds the replies we send, too
  if (cred.uid != geteuid()) {
    std::string why = "peer pid " + std::to_string(cred.pid) + " runs as uid " + std::to_string(cred.uid) +
                      ", not this process's uid " + std::to_string(geteuid());
    reply(conn, "{\"ok\":false,\"code\":\"E_IPC_AUTH\",\"error\":\"" + jsonEscape(why) + "\"}");
    onReject_(why, cred.pid);
    return;
  }
  Deadline deadline{std::chrono::steady_clock::now() + std::chrono::milliseconds(peerDeadlineMs_), wake_.get(),
                    peerDeadlineMs_};
  std::vector<int> received;
  try {
    char magic[4];
    readExact(conn, magic, 4, &deadline);
    if (std::memcmp(magic, kMagic, 4) != 0) throw PeerError{"E_IPC_PROTOCOL", "bad magic: not a vsnap fd message"};
    std::string nonce(kNonceLength, '\0');
    readExact(conn, nonce.data(), kNonceLength, &deadline);
    Offer offer;
    if (!takeNonce(nonce, offer)) throw PeerError{"E_IPC_AUTH", "unknown or already used nonce"};
    struct CloseOffer {
      std::vector<int>& fds;
      ~CloseOffer() { closeAll(fds); }
    } closeOffer{offer.fds};
    uint32_t headerBytes = readU32(conn, &deadline);
    uint32_t fdCount = readU32(conn, &deadline);
    if (headerBytes > kMaxHeaderBytes) throw PeerError{"E_IPC_PROTOCOL", "header too large"};
    if (fdCount > kMaxFds) throw PeerError{"E_IPC_PROTOCOL", "too many descriptors"};
    std::string header(headerBytes, '\0');
    readExact(conn, header.data(), headerBytes, &deadline);
    if (!isJsonObject(header)) throw PeerError{"E_IPC_PROTOCOL", "the header is not a JSON object"};
    receiveFdBatches(conn, fdCount, received, &deadline);
    if (offer.header.empty()) {
      reply(conn, "{\"ok\":true}");
    } else {
      reply(conn, "{\"ok\":true,\"fds\":" + std::to_string(offer.fds.size()) + ",\"offer\":" + offer.header + "}");
      sendFdBatches(conn, offer.fds, path_);
    }
    Delivery d{std::move(nonce), std::move(header), std::move(received), cred.pid, cred.uid};
    received.clear();
    onDelivery_(std::move(d));
  } catch (const PeerError& e) {
    closeAll(received);
    reply(conn, "{\"ok\":false,\"code\":\"" + e.code + "\",\"error\":\"" + jsonEscape(e.message) + "\"}");
    onReject_(e.message, cred.pid);
  } catch (const std::exception& e) {
    closeAll(received);
    reply(conn, std::string("{\"ok\":false,\"code\":\"E_INTERNAL\",\"error\":\"") + jsonEscape(e.what()) + "\"}");
    onReject_(e.what(), cred.pid);
  }
}

Reply sendFds(const std::string& path, const std::string& nonce, const std::string& header,
              const std::vector<int>& fds, int timeoutMs) {
  if (nonce.size() != kNonceLength) throwInvalid("a nonce is 64 hex digits");
  if (fds.size() > kMaxFds) throwInvalid("too many descriptors");
  sockaddr_un addr = address(path);
  UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) throwSystemError("socket", path, errno);
  setTimeouts(sock.get(), timeoutMs);
  if (connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throwSystemError("connect", path, errno);
  std::string frame(kMagic, 4);
  frame += nonce;
  putU32(frame, static_cast<uint32_t>(header.size()));
  putU32(frame, static_cast<uint32_t>(fds.size()));
  frame += header;
  // A receiver that refuses us (bad nonce, other uid) replies and hangs up mid-message: a
  // broken pipe here still leaves its reply to read, which says why.
  try {
    writeExact(sock.get(), frame.data(), frame.size());
    sendFdBatches(sock.get(), fds, path);
  } catch (const NativeError& e) {
    const auto* err = std::get_if<int64_t>(&e.details().at("errno"));
    if (!err || (*err != EPIPE && *err != ECONNRESET)) throw;
  }
  Reply out;
  try {
    uint32_t length = readU32(sock.get(), nullptr);
    if (length > (1u << 20)) throw NativeError("E_IPC_PROTOCOL", "oversized reply from '" + path + "'");
    out.json.assign(length, '\0');
    readExact(sock.get(), out.json.data(), length, nullptr);
    // An offer's descriptors follow the reply: {"ok":true,"fds":M,...}
    auto at = out.json.find("\"fds\":");
    if (out.json.rfind("{\"ok\":true", 0) == 0 && at != std::string::npos) {
      size_t count = std::strtoul(out.json.c_str() + at + 6, nullptr, 10);
      if (count > kMaxFds) throw NativeError("E_IPC_PROTOCOL", "too many offered descriptors");
      receiveFdBatches(sock.get(), count, out.fds, nullptr);
    }
    return out;
  } catch (const PeerError& e) {
    closeAll(out.fds);
    throw NativeError(e.code, "no reply from '" + path + "': " + e.message);
  }
}

}  // namespace vsnap::ipc
