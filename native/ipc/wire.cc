#include "ipc/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace vsnap::ipc {
namespace {

// Waits until fd is readable, the deadline passes (PeerError) or the wake fd fires (PeerError).
void waitReadable(int fd, const Deadline* d) {
  if (!d) return;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d->at - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      throw PeerError{"E_TIMEOUT", "the peer did not finish its message within " + std::to_string(d->budgetMs) + " ms"};
    }
    pollfd p[2] = {{fd, POLLIN, 0}, {d->wakeFd, POLLIN, 0}};
    int r = poll(p, d->wakeFd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw PeerError{"E_IPC_PROTOCOL", std::strerror(errno)};
    if (d->wakeFd >= 0 && (p[1].revents & POLLIN)) throw PeerError{"E_CLOSED", "the receiver is closing"};
    if (r > 0) return;
  }
}

}  // namespace

void setTimeouts(int fd, int ms) {
  if (ms < 1) ms = 1;
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void readExact(int fd, void* buf, size_t n, const Deadline* deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    waitReadable(fd, deadline);
    ssize_t r = recv(fd, p, n, deadline ? MSG_DONTWAIT : 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (deadline) continue;  // spurious wake-up: wait again
      throw PeerError{"E_IPC_PROTOCOL", "peer timed out"};
    }
    if (r <= 0) throw PeerError{"E_IPC_PROTOCOL", r == 0 ? "peer closed the connection early" : std::strerror(errno)};
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void writeExact(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throwSystemError("send", "fd socket", errno);
    p += r;
    n -= static_cast<size_t>(r);
  }
}

uint32_t readU32(int fd, const Deadline* deadline) {
  unsigned char b[4];
  readExact(fd, b, 4, deadline);
  return b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
}

void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; i++) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void closeAll(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

void sendFdBatches(int sock, const std::vector<int>& fds, const std::string& what) {
  for (size_t sent = 0; sent < fds.size();) {
    size_t n = std::min<size_t>(kFdsPerBatch, fds.size() - sent);
    char marker = 'F';
    iovec iov{&marker, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerBatch)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds.data() + sent, sizeof(int) * n);
    ssize_t r = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r != 1) throwSystemError("sendmsg", what, errno);
    sent += n;
  }
}

void receiveFdBatches(int sock, size_t count, std::vector<int>& out, const Deadline* deadline) {
  size_t want = out.size() + count;
  while (out.size() < want) {
    waitReadable(sock, deadline);
    char marker = 0;
    iovec iov{&marker, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerBatch)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (deadline ? MSG_DONTWAIT : 0));
    if (r < 0 && (errno == EINTR || (deadline && (errno == EAGAIN || errno == EWOULDBLOCK)))) continue;
    if (r <= 0) throw PeerError{"E_IPC_PROTOCOL", r == 0 ? "peer closed before sending every descriptor" : std::strerror(errno)};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
        out.insert(out.end(), p, p + n);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) throw PeerError{"E_IPC_PROTOCOL", "descriptor batch truncated (over 250 in one frame?)"};
    if (marker != 'F') throw PeerError{"E_IPC_PROTOCOL", "expected a descriptor frame"};
  }
  if (out.size() != want) throw PeerError{"E_IPC_PROTOCOL", "received more descriptors than announced"};
}

}  // namespace vsnap::ipc
