// The ceiling for vsnap's benchmarks: raw cudaMemcpy between pinned host memory and device
// buffers of the same sizes the benchmark moves, one copy per region, synchronised, timed with
// the wall clock. argv: <repetitions> [--devices N] [--pages small|huge] <size in bytes>...
// prints one JSON object. With N devices, region i lives on device i % N and each device copies on
// its own stream, all at once (the aggregate the host's PCIe links allow; more streams a device
// moved no more, 2026-12-07). Pages: the host memory's, small (the default: aligned_alloc) or huge
// (an anonymous mapping advised MADV_HUGEPAGE before its pages are touched); the JSON says how
// much of it the kernel backed with huge pages (AnonHugePages of the mapping).
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e));                \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes of the mapping holding `base` backed by huge pages, from /proc/self/smaps (-1 where not found).
static long long hugeBytes(const void* base) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto want = reinterpret_cast<unsigned long long>(base);
  while (std::getline(smaps, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') != std::string::npos &&
        line.find('-') < line.find(' ')) {
      inside = lo <= want && want < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::atoll(line.c_str() + 14) * 1024;
    }
  }
  return -1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ceiling <reps> [--devices N] [--pages small|huge] <size>...\n");
    return 2;
  }
  int reps = std::atoi(argv[1]);
  int first = 2;
  int devices = 1;
  bool huge = false;
  while (first + 1 < argc && argv[first][0] == '-') {
    std::string flag = argv[first];
    std::string value = argv[first + 1];
    if (flag == "--devices") devices = std::atoi(value.c_str());
    else if (flag == "--pages" && (value == "small" || value == "huge")) huge = value == "huge";
    else {
      std::fprintf(stderr, "ceiling: unknown option %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
    first += 2;
  }
  if (devices < 1) {
    std::fprintf(stderr, "ceiling: --devices needs a count above 0\n");
    return 2;
  }
  std::vector<size_t> sizes;
  size_t total = 0;
  for (int i = first; i < argc; i++) {
    sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    total += sizes.back();
  }
  std::vector<void*> dev(sizes.size());
  std::vector<cudaStream_t> streams(devices);
  for (int d = 0; d < devices; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
  }
  for (size_t i = 0; i < sizes.size(); i++) {
    CHECK(cudaSetDevice(static_cast<int>(i % devices)));
    CHECK(cudaMalloc(&dev[i], sizes[i]));
  }
  auto syncAll = [&] {
    for (int d = 0; d < devices; d++) {
      CHECK(cudaSetDevice(d));
      CHECK(cudaDeviceSynchronize());
    }
  };
  size_t mapped = (total + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  char* host = nullptr;
  if (huge) {
    void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("mmap");
      return 1;
    }
    madvise(m, mapped, MADV_HUGEPAGE);
    host = static_cast<char*>(m);
  } else {
    host = static_cast<char*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096));
  }
  for (size_t off = 0; off < total; off += 4096) host[off] = 0;  // faulted in before pinning, as vsnap's buffers are
  auto p0 = std::chrono::steady_clock::now();
  CHECK(cudaHostRegister(host, total, cudaHostRegisterPortable));
  double pinSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
  for (size_t off = 0; off < total; off += 4096) host[off] = static_cast<char>(off >> 12);

  std::vector<double> h2d, d2h;
  for (int r = 0; r < reps; r++) {
    for (int dir = 0; dir < 2; dir++) {
      syncAll();
      auto t0 = std::chrono::steady_clock::now();
      size_t off = 0;
      for (size_t i = 0; i < sizes.size(); i++) {
        int d = static_cast<int>(i % devices);
        CHECK(cudaSetDevice(d));
        if (dir == 0) CHECK(cudaMemcpyAsync(dev[i], host + off, sizes[i], cudaMemcpyHostToDevice, streams[d]));
        else CHECK(cudaMemcpyAsync(host + off, dev[i], sizes[i], cudaMemcpyDeviceToHost, streams[d]));
        off += sizes[i];
      }
      syncAll();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (dir == 0 ? h2d : d2h).push_back(total / s / 1e9);
    }
  }
  std::printf("{\"bytes\":%zu,\"regions\":%zu,\"devices\":%d,\"streams\":%d,\"pages\":\"%s\",\"hugeBytes\":%lld,"
              "\"reps\":%d,\"pinSeconds\":%.3f,"
              "\"h2dGBps\":{\"max\":%.2f,\"median\":%.2f},\"d2hGBps\":{\"max\":%.2f,\"median\":%.2f}}\n",
              total, sizes.size(), devices, 1, huge ? "huge" : "small", hugeBytes(host), reps, pinSeconds, *std::max_element(h2d.begin(), h2d.end()), median(h2d),
              *std::max_element(d2h.begin(), d2h.end()), median(d2h));
  CHECK(cudaHostUnregister(host));
  return 0;
}
