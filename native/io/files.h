// File and descriptor helpers used by the store and the transfer engine.
#pragma once

#include <cstdint>
#include <string>

#include "common/fd.h"

namespace vsnap::io {

// An anonymous memory file (memfd) of the given size: host memory with a descriptor, used
// as a region by the host backend and passed between processes like a GPU handle.
int createMemfd(const std::string& name, uint64_t size);

// Size of whatever a descriptor refers to (regular file or memfd).
uint64_t fdSize(int fd);

// flock(2) on a lock file, created if needed. Returns the open descriptor holding the lock,
// or -1 when nonBlocking and another descriptor holds a conflicting lock.
// readOnly: opens an existing lock file O_RDONLY (creating nothing; flock(2) needs no write
// access) and returns -2 when there is none; a link there is refused (O_NOFOLLOW: ELOOP).
int lockFile(const std::string& path, bool exclusive, bool nonBlocking, bool readOnly = false);

// A blob file being written: space reserved up front (E_NO_SPACE before any data moves),
// writeback started as chunks land, flushed to stable storage by finish().
class BlobWriter {
 public:
  BlobWriter(const std::string& path, uint64_t size);
  void write(uint64_t offset, const void* data, uint64_t length);
  void finish();  // fdatasync + close
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd fd_;
};

// A blob file being read, optionally with O_DIRECT (falls back to buffered where the file
// system refuses it). Opening checks the size, so a truncated blob is refused before any
// byte is copied anywhere.
class BlobReader {
 public:
  BlobReader(const std::string& path, uint64_t expectedSize, bool direct);
  // Reads exactly length bytes at offset into dst (dst and offset 4 KiB aligned when direct;
  // dst must have room for length rounded up to 4 KiB). Throws E_BLOB_TRUNCATED on a short read.
  void read(uint64_t offset, void* dst, uint64_t length);
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }

 private:
  std::string path_;
  UniqueFd fd_;
  bool direct_ = false;
};

constexpr uint64_t kDirectAlignment = 4096;

}  // namespace vsnap::io
