// The ceiling for vsnap's benchmarks: raw cudaMemcpy between pinned host memory and device
// buffers of the same sizes the benchmark moves, one copy per region, synchronised, timed with
// the wall clock. argv: <repetitions> <size in bytes>... ; prints one JSON object.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
    std::fprintf(stderr, "usage: ceiling <reps> <size>...\n");
    return 2;
  }
  int reps = std::atoi(argv[1]);
  std::vector<size_t> sizes;
  size_t total = 0;
  for (int i = 2; i < argc; i++) {
    sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    total += sizes.back();
  }
  std::vector<void*> dev(sizes.size());
  for (size_t i = 0; i < sizes.size(); i++) CHECK(cudaMalloc(&dev[i], sizes[i]));
  char* host = static_cast<char*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096));
  auto p0 = std::chrono::steady_clock::now();
  CHECK(cudaHostRegister(host, total, cudaHostRegisterPortable));
  double pinSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
  for (size_t off = 0; off < total; off += 4096) host[off] = static_cast<char>(off >> 12);

  std::vector<double> h2d, d2h;
  for (int r = 0; r < reps; r++) {
    for (int dir = 0; dir < 2; dir++) {
      CHECK(cudaDeviceSynchronize());
      auto t0 = std::chrono::steady_clock::now();
      size_t off = 0;
      for (size_t i = 0; i < sizes.size(); i++) {
        if (dir == 0) CHECK(cudaMemcpy(dev[i], host + off, sizes[i], cudaMemcpyHostToDevice));
        else CHECK(cudaMemcpy(host + off, dev[i], sizes[i], cudaMemcpyDeviceToHost));
        off += sizes[i];
      }
      CHECK(cudaDeviceSynchronize());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (dir == 0 ? h2d : d2h).push_back(total / s / 1e9);
    }
  }
  std::printf("{\"bytes\":%zu,\"regions\":%zu,\"reps\":%d,\"pinSeconds\":%.3f,"
              "\"h2dGBps\":{\"max\":%.2f,\"median\":%.2f},\"d2hGBps\":{\"max\":%.2f,\"median\":%.2f}}\n",
              total, sizes.size(), reps, pinSeconds, *std::max_element(h2d.begin(), h2d.end()), median(h2d),
              *std::max_element(d2h.begin(), d2h.end()), median(d2h));
  CHECK(cudaHostUnregister(host));
  return 0;
}
