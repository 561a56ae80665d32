// The byte-level pieces of the fd channel (see fd_channel.h for the protocol): exact reads and
// writes, u32 framing, and descriptor batches. A read on the listener's side runs against a
// Deadline: the whole message must arrive before it, and the listener's wake descriptor
// (readable once it is closing) cuts every wait short.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace vsnap::ipc {

constexpr uint32_t kFdsPerBatch = 250;

// A failure to report to the peer: code and message go back in the reply.
struct PeerError {
  std::string code;
  std::string message;
};

struct Deadline {
  std::chrono::steady_clock::time_point at;
  int wakeFd = -1;  // readable: stop waiting (the listener is closing)
  int budgetMs = 0; // named in the timeout message
};

// Reads exactly n bytes. With a deadline, waits no later than it; without, relies on the
// socket's SO_RCVTIMEO. Throws PeerError.
void readExact(int fd, void* buf, size_t n, const Deadline* deadline);
uint32_t readU32(int fd, const Deadline* deadline);
void writeExact(int fd, const void* buf, size_t n);  // throws NativeError (E_IO)
void putU32(std::string& out, uint32_t v);
void setTimeouts(int fd, int ms);

void closeAll(std::vector<int>& fds);
void sendFdBatches(int sock, const std::vector<int>& fds, const std::string& what);
// Receives `count` descriptors into `out` (appended as they come, so the caller can close them
// on failure). Throws PeerError.
void receiveFdBatches(int sock, size_t count, std::vector<int>& out, const Deadline* deadline);

}  // namespace vsnap::ipc
