// The vsnap-c1 chunk codec on the CPU (docs/compression.md): encode a chunk's bytes given a
// dtype hint, decode a coded chunk with every field checked, so a damaged chunk is reported
// (E_CODEC_CORRUPT) and never makes the decoder read or write outside its buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/codec_format.h"

namespace vsnap::codec {

// What the encoder decided for a chunk (the same function decides on the CPU and the GPU, so
// both write the same bytes).
struct Choice {
  uint8_t mode = vsnap_c1::kModeRaw;
  uint8_t kind = 0;
  uint32_t width = 0;
  uint8_t table[256] = {};  // tableEntries(width) bytes; the escape's slot stays 0
  uint64_t exceptionCount = 0;
  uint64_t codedSize = 0;
};

// The encoder's choice for a chunk of rawSize bytes from two histograms: of the hint kind's
// symbols (elements only, not the tail) and of the bytes. hintKind 0 or kBytes: bytes only.
Choice choose(uint32_t hintKind, uint64_t rawSize, const uint64_t* hintHist, const uint64_t* byteHist);

// A symbol's code under a choice, kEscapeMark for an escaped symbol (the GPU encoder's map).
constexpr uint8_t kEscapeMark = 255;
void codeMap(const Choice& c, uint8_t* codeOf);

// Histogram of a kind's symbols over [data, +size) (elements only) into hist[256].
void histogram(uint32_t kind, const uint8_t* data, uint64_t size, uint64_t* hist);

// The header and table bytes of a choice: out must hold layout.codesOff bytes, zeroed.
void writeHeader(const Choice& c, uint64_t rawSize, uint8_t* out);

// Encodes [data, +size) with a dtype hint (a vsnap_c1::Kind, or 0 for none).
std::vector<uint8_t> encode(const uint8_t* data, uint64_t size, uint32_t hintKind);

// A coded chunk's header fields, validated (throws E_CODEC_CORRUPT).
struct Header {
  uint8_t mode = 0, kind = 0;
  uint32_t width = 0;
  uint64_t rawSize = 0, codedSize = 0;
  uint32_t blockCount = 0;
  uint64_t exceptionCount = 0;
  vsnap_c1::Layout layout{};
};

// Checks everything but the code stream: header, sizes, table and block table. expectedRaw is
// the raw size the caller expects (the manifest's); coded must be exactly the chunk.
Header parse(const uint8_t* coded, uint64_t codedSize, uint64_t expectedRaw);

// Decodes a coded chunk into out (expectedRaw bytes). Throws E_CODEC_CORRUPT.
void decode(const uint8_t* coded, uint64_t codedSize, uint8_t* out, uint64_t expectedRaw);

// Throws E_CODEC_CORRUPT with a reason.
[[noreturn]] void corrupt(const char* reason);

}  // namespace vsnap::codec
