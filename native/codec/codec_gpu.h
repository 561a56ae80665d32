// The vsnap-c1 codec on the GPU: the kernels of codec_kernel.cu (embedded as codec_kernel.inc,
// loaded with the driver API like the digest kernel), enqueued on a caller's stream over device
// memory, and host-to-host helpers that go through the device (tests, microbench).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "codec/codec.h"

namespace vsnap::cuda {
class Context;
}

namespace vsnap::codec {

// Device scratch a decode needs: one 32-bit error word (zeroed before the launch).
constexpr uint64_t kDecodeScratchBytes = 16;
// Device scratch an encode of rawSize bytes needs: histograms, the code map, error word and one
// 32-bit escape count per block (about rawSize / 1024 bytes: 64 KiB for a 64 MiB chunk).
uint64_t encodeScratchBytes(uint64_t rawSize);

// Enqueues the decode of a chunk whose header the host checked (h = parse() of the host copy of
// the same bytes) from device src (h.codedSize bytes) into dst (h.rawSize bytes); both 16-byte
// aligned. Sets *errors (device, zeroed by the caller) to nonzero for a block whose escapes
// disagree with its block table; the caller checks it after the stream is done.
void enqueueDecode(const std::shared_ptr<cuda::Context>& ctx, CUstream stream, const Header& h, CUdeviceptr src, CUdeviceptr dst,
                   CUdeviceptr errors);

// Encodes device src (rawSize bytes) into dst (room for rawSize + 64 bytes), both 16-byte
// aligned, with scratch of encodeScratchBytes(rawSize). Waits on the stream once (the
// histogram decides the coding) and at the end; returns the choice (its codedSize bytes at dst).
// Writes the same bytes as the CPU encoder.
Choice encodeDevice(const std::shared_ptr<cuda::Context>& ctx, CUstream stream, CUdeviceptr src, uint64_t rawSize, uint32_t hintKind,
                    CUdeviceptr dst, CUdeviceptr scratch);

// Host bytes in, host bytes out, through the device (tests).
struct DeviceResult {
  std::vector<uint8_t> bytes;
  float kernelMs = 0;
};
DeviceResult decodeThroughDevice(int device, const uint8_t* coded, uint64_t codedSize, uint64_t rawSize);
DeviceResult encodeThroughDevice(int device, const uint8_t* data, uint64_t size, uint32_t hintKind);

}  // namespace vsnap::codec
