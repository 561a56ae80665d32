#include "codec/codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"

namespace vsnap::codec {
namespace {

using namespace vsnap_c1;

void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }  // little-endian hosts only
void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

template <uint32_t E>
inline uint32_t loadElem(const uint8_t* p) {
  if constexpr (E == 1) return p[0];
  if constexpr (E == 2) return uint32_t(p[0]) | uint32_t(p[1]) << 8;
  if constexpr (E == 4) return get32(p);
  return 0;
}
template <uint32_t E>
inline void storeElem(uint8_t* p, uint32_t v) {
  if constexpr (E == 1) p[0] = uint8_t(v);
  if constexpr (E == 2) {
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
  }
  if constexpr (E == 4) put32(p, v);
}

// LSB-first bit stream writer over a zeroed buffer.
struct BitWriter {
  uint8_t* p;
  uint64_t acc = 0;
  uint32_t n = 0;
  void put(uint32_t v, uint32_t bits) {
    acc |= uint64_t(v) << n;
    n += bits;
    while (n >= 8) {
      *p++ = uint8_t(acc);
      acc >>= 8;
      n -= 8;
    }
  }
  void flush() {
    if (n) *p++ = uint8_t(acc);
    acc = 0;
    n = 0;
  }
};

// LSB-first reader of a stream known (by the layout) to hold at least the bits asked for.
struct BitReader {
  const uint8_t* p;
  const uint8_t* end;
  uint64_t acc = 0;
  uint32_t n = 0;
  uint32_t get(uint32_t bits) {
    while (n < bits) {
      acc |= uint64_t(p < end ? *p : 0) << n;  // never past end, whatever the layout says
      p++;
      n += 8;
    }
    uint32_t v = uint32_t(acc & ((uint64_t{1} << bits) - 1));
    acc >>= bits;
    n -= bits;
    return v;
  }
};

template <uint32_t K>
void encodePlanes(const uint8_t* data, uint64_t size, const Choice& c, uint8_t* out) {
  constexpr KindInfo ki = kindInfo(K);
  constexpr uint32_t E = ki.elemBytes;
  const Layout l = layoutOf(K, size, c.width, c.exceptionCount);
  const uint32_t esc = escapeCode(c.width);
  uint8_t map[256];
  codeMap(c, map);
  uint32_t codeOf[256];
  for (uint32_t s = 0; s < 256; s++) codeOf[s] = map[s] == kEscapeMark ? esc : map[s];
  uint8_t* exc = out + l.excOff;
  uint64_t cursor = 0;
  for (uint32_t b = 0; b < l.blockCount; b++) {
    put32(out + l.blockOffOff + 4ull * b, uint32_t(cursor));
    uint64_t first = uint64_t(b) * kBlockElems, count = std::min<uint64_t>(kBlockElems, l.elems - first);
    BitWriter codes{out + l.codesOff + uint64_t(b) * (kBlockElems / 8) * c.width};
    BitWriter rest{out + l.restOff + uint64_t(b) * (kBlockElems / 8) * ki.restBits};
    const uint8_t* src = data + first * E;
    for (uint64_t i = 0; i < count; i++) {
      uint32_t v = loadElem<E>(src + i * E);
      uint32_t sym = symbolOf(v, ki);
      uint32_t code = codeOf[sym];
      if (c.width) codes.put(code, c.width);
      if (code == esc) exc[cursor++] = uint8_t(sym);
      if constexpr (ki.restBits) rest.put(restOf(v, ki), ki.restBits);
    }
    codes.flush();
    rest.flush();
  }
  std::memcpy(out + l.tailOff, data + l.elems * E, l.tailBytes);
}

template <uint32_t K>
void decodePlanes(const uint8_t* in, const Header& h, uint8_t* out) {
  constexpr KindInfo ki = kindInfo(K);
  constexpr uint32_t E = ki.elemBytes;
  const Layout& l = h.layout;
  const uint32_t w = h.width, esc = escapeCode(w);
  uint8_t table[256] = {};
  std::memcpy(table, in + l.tableOff, tableEntries(w));
  const uint8_t* exc = in + l.excOff;
  for (uint32_t b = 0; b < l.blockCount; b++) {
    uint64_t first = uint64_t(b) * kBlockElems, count = std::min<uint64_t>(kBlockElems, l.elems - first);
    uint64_t cursor = get32(in + l.blockOffOff + 4ull * b);
    uint64_t end = b + 1 < l.blockCount ? get32(in + l.blockOffOff + 4ull * (b + 1)) : h.exceptionCount;
    const uint8_t* cp = in + l.codesOff + uint64_t(b) * (kBlockElems / 8) * w;
    const uint8_t* rp = in + l.restOff + uint64_t(b) * (kBlockElems / 8) * ki.restBits;
    BitReader codes{cp, cp + (count * w + 7) / 8};
    BitReader rest{rp, rp + (count * ki.restBits + 7) / 8};
    uint8_t* dst = out + first * E;
    for (uint64_t i = 0; i < count; i++) {
      uint32_t code = w ? codes.get(w) : 0;
      uint32_t sym;
      if (code == esc) {
        if (cursor >= end) corrupt("a block has more escapes than its exception list");
        sym = exc[cursor++];
        if (sym >> ki.expBits) corrupt("an exception is not a symbol of the element kind");
      } else {
        sym = table[code];
      }
      uint32_t r = ki.restBits ? rest.get(ki.restBits) : 0;
      storeElem<E>(dst + i * E, joinElement(sym, r, ki));
    }
    if (cursor != end) corrupt("a block has fewer escapes than its exception list");
  }
  std::memcpy(out + l.elems * E, in + l.tailOff, l.tailBytes);
}

struct Candidate {
  uint32_t width = 0;
  uint64_t exceptions = 0;
  uint64_t size = ~uint64_t{0};
  uint8_t table[256] = {};
};

// The best width for one kind (smallest coded size, the smaller width on a tie).
Candidate bestFor(uint32_t kind, uint64_t rawSize, const uint64_t* hist) {
  Candidate best;
  KindInfo ki = kindInfo(kind);
  uint64_t elems = rawSize / ki.elemBytes;
  if (elems == 0 || rawSize > kMaxPlanesRaw) return best;
  uint32_t order[256];
  uint32_t distinct = 0;
  for (uint32_t s = 0; s < (1u << ki.expBits); s++) {
    if (hist[s]) order[distinct++] = s;
  }
  // most frequent first; equal counts in symbol order, so the order is the same everywhere
  std::sort(order, order + distinct, [&](uint32_t a, uint32_t b) { return hist[a] != hist[b] ? hist[a] > hist[b] : a < b; });
  auto consider = [&](uint32_t w, uint64_t exceptions) {
    uint64_t size = layoutOf(kind, rawSize, w, exceptions).codedSize;
    if (size >= best.size) return;
    best = Candidate{};
    best.width = w;
    best.exceptions = exceptions;
    best.size = size;
    if (w == 0) {
      best.table[0] = uint8_t(order[0]);
    } else {
      for (uint32_t i = 0; i < std::min(distinct, tableEntries(w) - 1); i++) best.table[i] = uint8_t(order[i]);
    }
  };
  if (distinct == 1) consider(0, 0);
  uint64_t covered = 0;
  uint32_t used = 0;
  for (uint32_t w = 1; w <= ki.expBits; w++) {
    uint32_t slots = tableEntries(w) - 1;
    while (used < slots && used < distinct) covered += hist[order[used++]];
    consider(w, elems - covered);
  }
  return best;
}

}  // namespace

[[noreturn]] void corrupt(const char* reason) {
  throw NativeError("E_CODEC_CORRUPT", std::string("coded chunk is damaged: ") + reason, {{"reason", std::string(reason)}});
}

void codeMap(const Choice& c, uint8_t* codeOf) {
  std::fill(codeOf, codeOf + 256, kEscapeMark);
  if (c.width == 0) {
    codeOf[c.table[0]] = 0;
    return;
  }
  // the first slot of a symbol wins (the table's unused slots repeat symbol 0)
  for (uint32_t i = tableEntries(c.width) - 1; i-- > 0;) codeOf[c.table[i]] = uint8_t(i);
}

void histogram(uint32_t kind, const uint8_t* data, uint64_t size, uint64_t* hist) {
  std::fill(hist, hist + 256, 0);
  KindInfo ki = kindInfo(kind);
  uint64_t elems = size / ki.elemBytes;
  switch (ki.elemBytes) {
    case 1:
      for (uint64_t i = 0; i < elems; i++) hist[symbolOf(data[i], ki)]++;
      break;
    case 2:
      for (uint64_t i = 0; i < elems; i++) hist[symbolOf(loadElem<2>(data + 2 * i), ki)]++;
      break;
    default:
      for (uint64_t i = 0; i < elems; i++) hist[symbolOf(loadElem<4>(data + 4 * i), ki)]++;
  }
}

Choice choose(uint32_t hintKind, uint64_t rawSize, const uint64_t* hintHist, const uint64_t* byteHist) {
  if (hintKind != 0 && !kindValid(hintKind)) throwInvalid("codec element kind must be 1..6, not " + std::to_string(hintKind));
  Choice c;
  c.codedSize = kHeaderBytes + rawSize;
  Candidate best;
  uint32_t bestKind = 0;
  if (hintKind && hintKind != kBytes) {
    best = bestFor(hintKind, rawSize, hintHist);
    bestKind = hintKind;
  }
  Candidate bytes = bestFor(kBytes, rawSize, byteHist);
  if (bytes.size < best.size) {
    best = bytes;
    bestKind = kBytes;
  }
  if (best.size > rawSize) return c;  // does not shrink: stored raw
  c.mode = kModePlanes;
  c.kind = uint8_t(bestKind);
  c.width = best.width;
  std::memcpy(c.table, best.table, sizeof c.table);
  c.exceptionCount = best.exceptions;
  c.codedSize = best.size;
  return c;
}

void writeHeader(const Choice& c, uint64_t rawSize, uint8_t* out) {
  put32(out, kMagic);
  out[4] = kVersion;
  out[5] = c.mode;
  out[6] = c.kind;
  out[7] = uint8_t(c.width);
  put64(out + 8, rawSize);
  put64(out + 16, c.codedSize);
  if (c.mode == kModePlanes) {
    Layout l = layoutOf(c.kind, rawSize, c.width, c.exceptionCount);
    put32(out + 24, kBlockElems);
    put32(out + 28, l.blockCount);
    put32(out + 32, uint32_t(c.exceptionCount));
    std::memcpy(out + l.tableOff, c.table, tableEntries(c.width));
  }
}

std::vector<uint8_t> encode(const uint8_t* data, uint64_t size, uint32_t hintKind) {
  static uint64_t noHist[256];
  uint64_t byteHist[256], hintHist[256];
  bool hinted = hintKind && hintKind != kBytes && kindValid(hintKind);
  if (size <= kMaxPlanesRaw) {
    histogram(kBytes, data, size, byteHist);
    if (hinted) histogram(hintKind, data, size, hintHist);
  } else {
    std::fill(byteHist, byteHist + 256, 0);
  }
  Choice c = choose(hintKind, size, hinted ? hintHist : noHist, byteHist);
  std::vector<uint8_t> out(c.codedSize, 0);
  writeHeader(c, size, out.data());
  if (c.mode == kModeRaw) {
    if (size) std::memcpy(out.data() + kHeaderBytes, data, size);
    return out;
  }
  switch (c.kind) {
    case kBytes: encodePlanes<kBytes>(data, size, c, out.data()); break;
    case kBf16: encodePlanes<kBf16>(data, size, c, out.data()); break;
    case kFp16: encodePlanes<kFp16>(data, size, c, out.data()); break;
    case kFp32: encodePlanes<kFp32>(data, size, c, out.data()); break;
    case kE4m3: encodePlanes<kE4m3>(data, size, c, out.data()); break;
    case kE5m2: encodePlanes<kE5m2>(data, size, c, out.data()); break;
  }
  return out;
}

Header parse(const uint8_t* in, uint64_t codedSize, uint64_t expectedRaw) {
  if (codedSize < kHeaderBytes) corrupt("shorter than its header");
  if (get32(in) != kMagic) corrupt("not a vsnap-c1 chunk (bad magic)");
  if (in[4] != kVersion) corrupt("unknown format version");
  for (uint32_t i = 36; i < kHeaderBytes; i++) {
    if (in[i]) corrupt("reserved header bytes are not zero");
  }
  Header h;
  h.mode = in[5];
  h.kind = in[6];
  h.width = in[7];
  h.rawSize = get64(in + 8);
  h.codedSize = get64(in + 16);
  h.blockCount = get32(in + 28);
  h.exceptionCount = get32(in + 32);
  if (h.rawSize != expectedRaw) corrupt("raw size differs from the expected size");
  if (h.codedSize != codedSize) corrupt("coded size differs from the chunk's length");
  if (h.mode == kModeRaw) {
    if (h.kind || h.width || get32(in + 24) || h.blockCount || h.exceptionCount) corrupt("a raw chunk with coding fields set");
    if (h.rawSize > ~uint64_t{0} - kHeaderBytes || codedSize != kHeaderBytes + h.rawSize) corrupt("raw chunk length is not header + raw size");
    return h;
  }
  if (h.mode != kModePlanes) corrupt("unknown mode");
  if (!kindValid(h.kind)) corrupt("unknown element kind");
  KindInfo ki = kindInfo(h.kind);
  if (h.width > ki.expBits) corrupt("code width wider than the kind's symbols");
  if (get32(in + 24) != kBlockElems) corrupt("block size is not 4096 elements");
  if (h.rawSize > kMaxPlanesRaw || h.rawSize < ki.elemBytes) corrupt("raw size out of range for a coded chunk");
  h.layout = layoutOf(h.kind, h.rawSize, h.width, h.exceptionCount);
  if (h.blockCount != h.layout.blockCount) corrupt("block count does not match the raw size");
  if (h.exceptionCount > h.layout.elems) corrupt("more exceptions than elements");
  if (h.layout.codedSize != codedSize) corrupt("section sizes do not add up to the chunk's length");
  const uint8_t* table = in + h.layout.tableOff;
  uint32_t symbols = h.width == 0 ? 1 : tableEntries(h.width) - 1;
  for (uint32_t i = 0; i < symbols; i++) {
    if (table[i] >> ki.expBits) corrupt("a table entry is not a symbol of the element kind");
  }
  if (h.width && table[symbols]) corrupt("the escape's table slot is not zero");
  uint32_t prev = 0;
  for (uint32_t b = 0; b < h.blockCount; b++) {
    uint32_t off = get32(in + h.layout.blockOffOff + 4ull * b);
    if ((b == 0 && off != 0) || off < prev || off > h.exceptionCount) corrupt("block table offsets out of order or out of range");
    prev = off;
  }
  return h;
}

void decode(const uint8_t* coded, uint64_t codedSize, uint8_t* out, uint64_t expectedRaw) {
  Header h = parse(coded, codedSize, expectedRaw);
  if (h.mode == kModeRaw) {
    if (h.rawSize) std::memcpy(out, coded + kHeaderBytes, h.rawSize);
    return;
  }
  switch (h.kind) {
    case kBytes: decodePlanes<kBytes>(coded, h, out); break;
    case kBf16: decodePlanes<kBf16>(coded, h, out); break;
    case kFp16: decodePlanes<kFp16>(coded, h, out); break;
    case kFp32: decodePlanes<kFp32>(coded, h, out); break;
    case kE4m3: decodePlanes<kE4m3>(coded, h, out); break;
    case kE5m2: decodePlanes<kE5m2>(coded, h, out); break;
  }
}

}  // namespace vsnap::codec
