#include "js/js_host_buffer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "io/files.h"
#include "js/js_memory.h"
#include "transfer/host_buffer.h"

namespace vsnap::js {

namespace {

// One piece of a read: at most kPiece bytes of one file into the buffer.
struct Piece {
  size_t file;
  uint64_t fileOffset, length, at;
};
constexpr uint64_t kPiece = 8ull << 20;
static_assert(kPiece % io::kDirectAlignment == 0, "a direct read's pieces stay 4 KiB aligned");

struct ReadResult {
  uint64_t bytes = 0;
  double seconds = 0;
};

// Byte ranges of files read into a HostBuffer with pread, pieces of 8 MiB spread over threads
// (O_DIRECT with `direct`, where the file system allows it); the first failure (E_BLOB_MISSING,
// E_BLOB_TRUNCATED, ...) stops the rest and is thrown.
ReadResult readFiles(char* base, const std::vector<std::pair<std::string, uint64_t>>& files, const std::vector<Piece>& pieces, unsigned threads, bool direct) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<io::BlobReader>> readers;
  for (const auto& [path, size] : files) readers.push_back(std::make_unique<io::BlobReader>(path, size, direct));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex errorMutex;
  auto worker = [&] {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < pieces.size();) {
      const Piece& p = pieces[i];
      try {
        readers[p.file]->read(p.fileOffset, base + p.at, p.length);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(pieces.size())));
  for (unsigned t = 1; t < n; t++) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  ReadResult r;
  for (const Piece& p : pieces) r.bytes += p.length;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

// readFilesInto({ kind: 'buffer', buffer, offset }, [{ path, size, reads: Float64Array of
// (fileOffset, length, at) }], threads, direct?) -> { bytes, seconds }: each read's bytes land at
// offset + at in the buffer; `size` is the file's expected size (checked at open: E_BLOB_TRUNCATED
// otherwise). `direct`: O_DIRECT, so every read's fileOffset and buffer position are 4 KiB aligned
// and the buffer has room for its length rounded up to 4 KiB (the bytes past it are overwritten).
Napi::Value ReadFilesInto(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto dest = std::make_shared<MemorySpec>(parseMemory(env, info[0]));
  if (dest->kind != MemorySpec::Kind::Buffer) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "the destination must be a HostBuffer"));
  if (!info[1].IsArray()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "files must be an array"));
  const uint64_t limit = dest->buffer->size();
  const bool direct = info.Length() > 3 && info[3].IsBoolean() && info[3].As<Napi::Boolean>().Value();
  const uintptr_t base = reinterpret_cast<uintptr_t>(dest->buffer->data());
  Napi::Array list = info[1].As<Napi::Array>();
  auto files = std::make_shared<std::vector<std::pair<std::string, uint64_t>>>();
  auto pieces = std::make_shared<std::vector<Piece>>();
  for (uint32_t i = 0; i < list.Length(); i++) {
    Napi::Value v = list.Get(i);
    if (!v.IsObject()) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "files[" + std::to_string(i) + "] must be an object"));
    Napi::Object o = v.As<Napi::Object>();
    files->emplace_back(toString(getRequired(o, "path"), "path"), toU64(getRequired(o, "size"), "size"));
    Napi::Value r = getRequired(o, "reads");
    if (!r.IsTypedArray() || r.As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
      throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "reads must be a Float64Array"));
    }
    auto f = r.As<Napi::Float64Array>();
    if (f.ElementLength() % 3) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "reads holds 3 numbers a read"));
    for (size_t k = 0; k < f.ElementLength(); k += 3) {
      const auto fileOffset = static_cast<uint64_t>(f[k]), length = static_cast<uint64_t>(f[k + 1]), at = dest->offset + static_cast<uint64_t>(f[k + 2]);
      const uint64_t room = direct ? (length + io::kDirectAlignment - 1) / io::kDirectAlignment * io::kDirectAlignment : length;
      if (at > limit || room > limit - at) throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "a read lies outside the HostBuffer"));
      if (direct && (fileOffset % io::kDirectAlignment || (base + at) % io::kDirectAlignment)) {
        throw toJsError(env, NativeError("E_INVALID_ARGUMENT", "a direct read starts 4 KiB aligned in its file and in the HostBuffer"));
      }
      for (uint64_t from = 0; from < length; from += kPiece) pieces->push_back({i, fileOffset + from, std::min(kPiece, length - from), at + from});
    }
  }
  const unsigned threads = static_cast<unsigned>(std::max<int64_t>(1, toI64(info[2], "threads")));
  return PromiseWorker<ReadResult>::Run(
      env, [dest, files, pieces, threads, direct] { return readFiles(dest->buffer->data(), *files, *pieces, threads, direct); },
      [](Napi::Env env, ReadResult& r) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("bytes", static_cast<double>(r.bytes));
        o.Set("seconds", r.seconds);
        return o;
      },
      {info[0]});
}

}  // namespace

Napi::Function HostBuffer::Define(Napi::Env env) {
  Napi::Function fn = DefineClass(env, kName,
                                  {InstanceAccessor<&HostBuffer::Size>("size"), InstanceAccessor<&HostBuffer::Pinned>("pinned"),
                                   InstanceAccessor("closed", &HostBuffer::Closed, nullptr), InstanceMethod<&HostBuffer::Read>("read"),
                                   InstanceMethod("close", &HostBuffer::Close)});
  constructor(env) = Napi::Persistent(fn);
  return fn;
}

Napi::Value HostBuffer::Size(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->size()));
}
Napi::Value HostBuffer::Pinned(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), live(info.Env())->pinned()); }

// read(offset, length): a copy of the bytes (tests and diagnostics).
Napi::Value HostBuffer::Read(const Napi::CallbackInfo& info) {
  const auto& b = live(info.Env());
  uint64_t offset = toU64(info[0], "offset");
  uint64_t length = toU64(info[1], "length");
  if (offset > b->size() || length > b->size() - offset) {
    throw toJsError(info.Env(), NativeError("E_OUT_OF_RANGE", "read outside the host buffer"));
  }
  return Napi::Buffer<uint8_t>::Copy(info.Env(), reinterpret_cast<const uint8_t*>(b->data() + offset), length);
}

void initHostBuffer(Napi::Env env, Napi::Object exports) {
  exports.Set("HostBuffer", HostBuffer::Define(env));
  exports.Set("createHostBuffer", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    uint64_t size = toU64(info[0], "size");
    int pinDevice = static_cast<int>(toI64(info[1], "pinDevice"));
    return PromiseWorker<std::shared_ptr<transfer::HostBuffer>>::Run(
        info.Env(), [=] { return std::make_shared<transfer::HostBuffer>(size, pinDevice); },
        [](Napi::Env env, std::shared_ptr<transfer::HostBuffer>& b) { return HostBuffer::wrap(env, b); });
  }, "createHostBuffer"));
  exports.Set("readFilesInto", Napi::Function::New(env, ReadFilesInto, "readFilesInto"));
}

}  // namespace vsnap::js
