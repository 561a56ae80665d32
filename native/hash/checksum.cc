#include "hash/checksum.h"

#include <cstdio>

#include "common/error.h"

namespace vsnap::hash {
namespace {

const Impl& pick() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return kAvx512;
  if (__builtin_cpu_supports("avx2")) return kAvx2;
#endif
  return kBase;
}

const Impl& impl() {
  static const Impl& chosen = pick();
  return chosen;
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string Digest::hex() const {
  char out[33];
  std::snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return out;
}

Digest Digest::fromHex(const std::string& text) {
  if (text.size() != 32) throwInvalid("a checksum is 32 lowercase hex digits, got '" + text + "'");
  Digest d;
  for (size_t i = 0; i < 32; i++) {
    int v = hexValue(text[i]);
    if (v < 0) throwInvalid("a checksum is 32 lowercase hex digits, got '" + text + "'");
    uint64_t& half = i < 16 ? d.high : d.low;
    half = (half << 4) | static_cast<uint64_t>(v);
  }
  return d;
}

const char* implementation() { return impl().name; }

Digest digest(const void* data, size_t length) { return impl().oneShot(data, length); }

Hasher::Hasher() : state_(impl().create()) {
  if (!state_) throw std::bad_alloc();
  reset();
}
Hasher::~Hasher() { impl().destroy(state_); }
void Hasher::reset() { impl().reset(state_); }
void Hasher::update(const void* data, size_t length) { impl().update(state_, data, length); }
Digest Hasher::finish() const { return impl().finish(state_); }

}  // namespace vsnap::hash
