#include "io/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"

namespace vsnap::io {

int createMemfd(const std::string& name, uint64_t size) {
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) throwSystemError("memfd_create", name, errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    close(fd);
    throwSystemError("ftruncate", name, err);
  }
  return fd;
}

uint64_t fdSize(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) throwSystemError("fstat", "fd " + std::to_string(fd), errno);
  return static_cast<uint64_t>(st.st_size);
}

int lockFile(const std::string& path, bool exclusive, bool nonBlocking, bool readOnly) {
  int fd = readOnly ? open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 && readOnly && errno == ENOENT) return -2;
  if (fd < 0) throwSystemError("open", path, errno);
  int op = (exclusive ? LOCK_EX : LOCK_SH) | (nonBlocking ? LOCK_NB : 0);
  while (flock(fd, op) != 0) {
    int err = errno;
    if (err == EINTR) continue;
    close(fd);
    if (err == EWOULDBLOCK) return -1;
    throwSystemError("flock", path, err);
  }
  return fd;
}

BlobWriter::BlobWriter(const std::string& path, uint64_t size) : path_(path) {
  fd_.reset(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_.valid()) throwSystemError("open", path, errno);
  if (size > 0) {
    int err = posix_fallocate(fd_.get(), 0, static_cast<off_t>(size));
    // Some file systems (tmpfs on old kernels, NFS) do not support fallocate: fall back to
    // ftruncate, which reserves nothing but keeps the size right.
    if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
      if (ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) throwSystemError("ftruncate", path, errno);
    } else if (err != 0) {
      throwSystemError("fallocate", path, err);
    }
  }
}

void BlobWriter::write(uint64_t offset, const void* data, uint64_t length) {
  const char* p = static_cast<const char*>(data);
  uint64_t done = 0;
  while (done < length) {
    ssize_t n = pwrite(fd_.get(), p + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throwSystemError("pwrite", path_, errno);
    }
    done += static_cast<uint64_t>(n);
  }
  // Start writeback now, so dirty pages do not pile up and the final flush is short.
  sync_file_range(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length), SYNC_FILE_RANGE_WRITE);
}

void BlobWriter::finish() {
  if (fdatasync(fd_.get()) != 0) throwSystemError("fdatasync", path_, errno);
  int fd = fd_.release();
  if (close(fd) != 0) throwSystemError("close", path_, errno);
}

BlobReader::BlobReader(const std::string& path, uint64_t expectedSize, bool direct) : path_(path) {
  if (direct) {
    fd_.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
    direct_ = fd_.valid();
  }
  if (!fd_.valid()) fd_.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd_.valid()) {
    int err = errno;
    if (err == ENOENT) {
      throw NativeError("E_BLOB_MISSING", "blob '" + path + "' does not exist: the store lost it; run `vsnap verify` and recapture",
                        {{"path", path}});
    }
    throwSystemError("open", path, err);
  }
  uint64_t actual = fdSize(fd_.get());
  if (actual != expectedSize) {
    throw NativeError("E_BLOB_TRUNCATED",
                      "blob '" + path + "' holds " + std::to_string(actual) + " bytes, the manifest says " +
                          std::to_string(expectedSize),
                      {{"path", path}, {"expectedBytes", static_cast<int64_t>(expectedSize)},
                       {"actualBytes", static_cast<int64_t>(actual)}});
  }
  if (!direct_) posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
}

void BlobReader::read(uint64_t offset, void* dst, uint64_t length) {
  char* p = static_cast<char*>(dst);
  uint64_t want = direct_ ? (length + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment : length;
  uint64_t done = 0;
  while (done < want) {
    ssize_t n = pread(fd_.get(), p + done, want - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throwSystemError("pread", path_, errno);
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  if (done < length) {
    throw NativeError("E_BLOB_TRUNCATED",
                      "blob '" + path_ + "' ended at byte " + std::to_string(offset + done) + ", expected " +
                          std::to_string(offset + length),
                      {{"path", path_}, {"offset", static_cast<int64_t>(offset + done)}});
  }
}

}  // namespace vsnap::io
