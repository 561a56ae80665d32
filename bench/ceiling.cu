// The ceiling for vsnap's benchmarks: raw cudaMemcpy between pinned host memory and device
// buffers of the same sizes the benchmark moves, one copy per region, synchronised, timed with
// the wall clock. argv: <repetitions> [--devices N] <size in bytes>... ; prints one JSON object.
// With N devices, region i lives on device i % N and each device copies on its own stream, all
// at once (the aggregate the host's PCIe links allow).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ceiling <reps> [--devices N] <size>...\n");
    return 2;
  }
  int reps = std::atoi(argv[1]);
  int first = 2;
  int devices = 1;
  if (std::string(argv[2]) == "--devices" && argc > 4) {
    devices = std::atoi(argv[3]);
    first = 4;
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
  char* host = static_cast<char*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096));
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
  std::printf("{\"bytes\":%zu,\"regions\":%zu,\"devices\":%d,\"reps\":%d,\"pinSeconds\":%.3f,"
              "\"h2dGBps\":{\"max\":%.2f,\"median\":%.2f},\"d2hGBps\":{\"max\":%.2f,\"median\":%.2f}}\n",
              total, sizes.size(), devices, reps, pinSeconds, *std::max_element(h2d.begin(), h2d.end()), median(h2d),
              *std::max_element(d2h.begin(), d2h.end()), median(d2h));
  CHECK(cudaHostUnregister(host));
  return 0;
}
