// What the GPU's virtual-memory calls cost a bulk host-to-device copy running beside them: the
// copy of a pinned buffer into one VMM allocation per region (64 MiB chunks, one stream, as
// vsnap's hydrate lays them out), timed alone and with another process (the engine) or another
// thread of this one (the SDK) doing, at the same moment, one of the steps of a restore:
//   idle        a second process with a context, doing nothing (the baseline)
//   create      cuMemCreate + reserve + map + set access of as many regions (vLLM's wake)
//   createonly  cuMemCreate alone
//   map         reserve + map + set access of memory made before the copy
//   access      cuMemSetAccess alone, of memory mapped before the copy
//   import      import the copy's own targets by POSIX fd, reserve, map, set access (the adopt)
//   importonly  the import alone
//   free        unmap and release as many regions, made before the copy (the other engine's sleep)
//   thread-create  this process makes memory as `create`, on a second thread (the SDK's rest)
//   freed-<N>ms    this process frees as much memory, waits N ms, then makes the copy's targets
//                  (they get the freed memory) and copies at once; "besideSeconds" is the making
//   ofreed-<N>ms   another process frees as much memory (its own), this one waits N ms after the
//                  free returned, makes the copy's targets and copies: a serial swap, the other
//                  engine's sleep just before the restore; "besideSeconds" is the other's free
//   released-<N>ms another process, which had imported and mapped the copy's own targets, unmaps
//                  and releases them (the memory lives on here: nothing is freed), this one waits
//                  N ms and copies: a swap whose restore fills the memory the other engine let go
//   ofreed-beside  another process frees as much memory (its own) and, the moment its free returns,
//                  this one copies into targets it made before: a serial swap's restore, whose
//                  copy starts as the other engine's sleep ends
//   ofreed-thread  the same, with this process making as much memory on a second thread beside the
//                  copy (it gets the memory just freed): the filled restore's rest
// Every mode but the *-<N>ms and ofreed-beside/-thread ones starts its copy after a second of quiet
// (the memory freed by the rep before has been scrubbed). Modes to run may follow the three numbers.
// `--streams K` first: the copy's chunks go round robin over K streams (one by default).
// Each line also gives `firstGBps`: what landed in the copy's first 60 ms (from events recorded after
// each chunk), where the work beside it is concentrated.
// `--offset` instead says whether cuMemMap maps an allocation from a nonzero offset (what one
// allocation for many regions would need; CUDA 13 answers CUDA_ERROR_NOT_SUPPORTED).
// argv: <reps> <regions> <region MiB> [mode...]; prints one JSON object per line.
// Build: nvcc -O2 -o vmm-interference bench/vmm-interference.cu -lcuda -lpthread
#include <cuda.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda-bench.h"

extern char** environ;

struct Region {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
};

static void makeRegions(std::vector<Region>& rs, size_t size, bool exportable, bool doCreate, bool doMap, bool doAccess) {
  CUmemAllocationProp p = prop(exportable);
  CUmemAccessDesc a = access();
  for (auto& r : rs) {
    if (doCreate) CK(cuMemCreate(&r.h, size, &p, 0));
    if (doMap) {
      CK(cuMemAddressReserve(&r.va, size, 0, 0, 0));
      CK(cuMemMap(r.va, size, 0, r.h, 0));
    }
    if (doAccess) CK(cuMemSetAccess(r.va, size, &a, 1));
  }
}

static void dropRegions(std::vector<Region>& rs, size_t size) {
  for (auto& r : rs) {
    if (r.va) {
      CK(cuMemUnmap(r.va, size));
      CK(cuMemAddressFree(r.va, size));
      r.va = 0;
    }
    if (r.h) {
      CK(cuMemRelease(r.h));
      r.h = 0;
    }
  }
}

// The second process: set up, say "r" on fd 4, wait for "g" on fd 3, do its step, write its seconds
// on fd 4, wait for "e" (the copy is over), clean up.
static int helper(const std::string& mode, int n, size_t size, const std::vector<int>& fds) {
  context();
  const bool imports = mode == "import" || mode == "importonly" || mode == "release";
  std::vector<Region> rs(imports ? fds.size() : n);
  if (mode == "map") makeRegions(rs, size, false, true, false, false);
  if (mode == "access") makeRegions(rs, size, false, true, true, false);
  if (mode == "free") makeRegions(rs, size, false, true, true, true);
  if (mode == "release") {
    CUmemAccessDesc a = access();
    for (size_t i = 0; i < fds.size(); i++) {
      CK(cuMemImportFromShareableHandle(&rs[i].h, (void*)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      CK(cuMemAddressReserve(&rs[i].va, size, 0, 0, 0));
      CK(cuMemMap(rs[i].va, size, 0, rs[i].h, 0));
      CK(cuMemSetAccess(rs[i].va, size, &a, 1));
    }
    CK(cuCtxSynchronize());
  }
  char c = 'r';
  if (write(4, &c, 1) != 1 || read(3, &c, 1) != 1) return 1;
  auto t0 = Clock::now();
  CUmemAccessDesc a = access();
  if (mode == "create") makeRegions(rs, size, false, true, true, true);
  if (mode == "createonly") makeRegions(rs, size, false, true, false, false);
  if (mode == "map") {
    for (auto& r : rs) {
      CK(cuMemAddressReserve(&r.va, size, 0, 0, 0));
      CK(cuMemMap(r.va, size, 0, r.h, 0));
      CK(cuMemSetAccess(r.va, size, &a, 1));
    }
  }
  if (mode == "access")
    for (auto& r : rs) CK(cuMemSetAccess(r.va, size, &a, 1));
  if (mode == "import" || mode == "importonly") {
    for (size_t i = 0; i < fds.size(); i++) {
      CK(cuMemImportFromShareableHandle(&rs[i].h, (void*)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      if (mode == "import") {
        CK(cuMemAddressReserve(&rs[i].va, size, 0, 0, 0));
        CK(cuMemMap(rs[i].va, size, 0, rs[i].h, 0));
        CK(cuMemSetAccess(rs[i].va, size, &a, 1));
      }
    }
  }
  if (mode == "free" || mode == "release") dropRegions(rs, size);
  double s = since(t0);
  if (write(4, &s, sizeof s) != (ssize_t)sizeof s || read(3, &c, 1) != 1) return 1;
  dropRegions(rs, size);
  for (int fd : fds) close(fd);
  return 0;
}

struct Helper {
  pid_t pid = 0;
  int go = -1, back = -1;
};

static Helper spawnHelper(const char* self, const std::string& mode, int n, size_t mib, const std::vector<int>& fds) {
  int toChild[2], fromChild[2];
  if (pipe(toChild) || pipe(fromChild)) std::exit(1);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, toChild[0], 3);
  posix_spawn_file_actions_adddup2(&fa, fromChild[1], 4);
  std::string fdList;
  for (int fd : fds) {
    fcntl(fd, F_SETFD, 0);  // inherited by the helper
    fdList += (fdList.empty() ? "" : ",") + std::to_string(fd);
  }
  std::string ns = std::to_string(n), ms = std::to_string(mib);
  std::vector<char*> argv = {(char*)self, (char*)"--helper", (char*)mode.c_str(), (char*)ns.c_str(), (char*)ms.c_str(), (char*)fdList.c_str(), nullptr};
  Helper h;
  if (posix_spawn(&h.pid, self, &fa, nullptr, argv.data(), environ)) std::exit(1);
  posix_spawn_file_actions_destroy(&fa);
  close(toChild[0]);
  close(fromChild[1]);
  h.go = toChild[1];
  h.back = fromChild[0];
  for (int fd : fds) fcntl(fd, F_SETFD, FD_CLOEXEC);
  char c;
  if (read(h.back, &c, 1) != 1 || c != 'r') {
    std::fprintf(stderr, "helper %s did not start\n", mode.c_str());
    std::exit(1);
  }
  return h;
}

// Whether cuMemMap maps part of an allocation at a nonzero offset (one allocation for many regions).
static int offsetCheck() {
  const size_t size = 64ull << 20;
  CUmemAllocationProp p = prop(true);
  CUmemGenericAllocationHandle whole;
  CK(cuMemCreate(&whole, 2 * size, &p, 0));
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CUresult r = cuMemMap(va, size, size, whole, 0);
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  if (r == CUDA_SUCCESS) CK(cuMemUnmap(va, size));
  CK(cuMemAddressFree(va, size));
  CK(cuMemRelease(whole));
  std::printf("{\"mapAtOffset\":{\"result\":\"%s\"}}\n", name ? name : "?");
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[1]) == "--helper") {
    std::vector<int> fds;
    for (const char* p = argv[5]; *p;) {
      fds.push_back(std::atoi(p));
      while (*p && *p != ',') p++;
      if (*p == ',') p++;
    }
    return helper(argv[2], std::atoi(argv[3]), (size_t)std::atoll(argv[4]) << 20, fds);
  }
  if (argc > 1 && std::string(argv[1]) == "--offset") {
    context();
    return offsetCheck();
  }
  int streamCount = 1;
  if (argc > 2 && std::string(argv[1]) == "--streams") {
    streamCount = std::max(1, std::atoi(argv[2]));
    argv[2] = argv[0];
    argv += 2;
    argc -= 2;
  }
  int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  int n = argc > 2 ? std::atoi(argv[2]) : 252;
  size_t mib = argc > 3 ? std::atoll(argv[3]) : 68;
  size_t size = mib << 20, total = size * n;
  const size_t chunk = 64ull << 20;
  CUcontext ctx = context();
  (void)ctx;
  std::vector<CUstream> streams(streamCount);
  for (auto& st : streams) CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  const size_t chunksPerRegion = (size + chunk - 1) / chunk;
  std::vector<CUevent> landed(n * chunksPerRegion);
  for (auto& e : landed) CK(cuEventCreate(&e, CU_EVENT_DEFAULT));
  CUevent started;
  CK(cuEventCreate(&started, CU_EVENT_DEFAULT));
  void* host = nullptr;
  CK(cuMemHostAlloc(&host, total, CU_MEMHOSTALLOC_PORTABLE));
  std::memset(host, 1, total);

  std::vector<std::string> modes = {"alone", "idle", "create", "createonly", "map", "access", "import", "importonly", "free", "thread-create",
                                    "freed-0ms", "freed-50ms", "freed-100ms", "freed-200ms", "freed-400ms", "freed-1000ms",
                                    "ofreed-0ms", "ofreed-10ms", "ofreed-50ms", "ofreed-200ms", "ofreed-1000ms", "released-0ms", "released-10ms",
                                    "ofreed-beside", "ofreed-thread"};
  if (argc > 4) modes.assign(argv + 4, argv + argc);
  for (const std::string& modeName : modes) {
    const char* mode = modeName.c_str();
    // freed-<N>ms: as much memory as the copy's is freed here N ms before it starts (a swap's
    // other engine going to sleep just before); every other mode starts after a second of quiet.
    const bool freed = std::strncmp(mode, "freed-", 6) == 0;
    const bool obeside = modeName == "ofreed-beside" || modeName == "ofreed-thread";
    const bool ofreed = std::strncmp(mode, "ofreed-", 7) == 0 && !obeside;
    const bool threadCreate = modeName == "thread-create" || modeName == "ofreed-thread";
    const bool released = std::strncmp(mode, "released-", 9) == 0;
    const int settleMs = freed ? std::atoi(mode + 6) : ofreed ? std::atoi(mode + 7) : released ? std::atoi(mode + 9) : obeside ? 0 : 1000;
    // The helper's step: "free" for ofreed-*, "release" for released-*, else the mode's own. With
    // ofreed-* and released-* it runs (and ends) before the copy, else beside it.
    const std::string step = ofreed || obeside ? "free" : released ? "release" : modeName;
    const bool before = ofreed || released || obeside;
    std::vector<double> rates, firstRates, helperSeconds;
    for (int rep = 0; rep < reps; rep++) {
      std::vector<Region> targets(n), mine(n);
      std::vector<int> fds;
      if (freed) {
        makeRegions(mine, size, false, true, true, true);
        CK(cuCtxSynchronize());
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        dropRegions(mine, size);
        std::this_thread::sleep_for(std::chrono::milliseconds(settleMs));
        auto m0 = Clock::now();
        makeRegions(targets, size, true, true, true, true);
        helperSeconds.push_back(since(m0));
      } else if (!ofreed) {
        makeRegions(targets, size, true, true, true, true);
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      }
      if (std::strncmp(mode, "import", 6) == 0 || released)
        for (auto& t : targets) {
          int fd = -1;
          CK(cuMemExportToShareableHandle(&fd, t.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
          fds.push_back(fd);
        }
      bool other = std::strcmp(mode, "alone") != 0 && std::strcmp(mode, "thread-create") != 0 && !freed;
      Helper h;
      if (other) h = spawnHelper(argv[0], step, n, mib, fds);
      for (int fd : fds) close(fd);
      char c = 'g';
      if (before) {
        if (ofreed || obeside) std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the helper's memory settled
        double hs = 0;
        if (write(h.go, &c, 1) != 1 || read(h.back, &hs, sizeof hs) != (ssize_t)sizeof hs) return 1;
        helperSeconds.push_back(hs);
        std::this_thread::sleep_for(std::chrono::milliseconds(settleMs));
        if (ofreed) makeRegions(targets, size, true, true, true, true);
      }
      std::thread worker;
      double threadSeconds = 0;
      auto t0 = Clock::now();
      if (other && !before && write(h.go, &c, 1) != 1) return 1;
      CK(cuEventRecord(started, streams[0]));
      if (threadCreate)
        worker = std::thread([&] {
          CK(cuCtxSetCurrent(ctx));
          auto w0 = Clock::now();
          makeRegions(mine, size, true, true, true, true);
          threadSeconds = since(w0);
        });
      size_t k = 0;
      for (int i = 0; i < n; i++)
        for (size_t off = 0; off < size; off += chunk, k++) {
          CUstream st = streams[k % streams.size()];
          CK(cuMemcpyHtoDAsync(targets[i].va + off, (char*)host + (size_t)i * size + off, std::min(chunk, size - off), st));
          CK(cuEventRecord(landed[k], st));
        }
      for (auto& st : streams) CK(cuStreamSynchronize(st));
      double s = since(t0);
      rates.push_back(total / s / 1e9);
      {
        // what landed in the first 60 ms after the first copy was issued (GPU clock)
        const float window = 60.0f;
        size_t bytes = 0;
        k = 0;
        for (int i = 0; i < n; i++)
          for (size_t off = 0; off < size; off += chunk, k++) {
            float ms = 0;
            CK(cuEventElapsedTime(&ms, started, landed[k]));
            if (ms <= window) bytes += std::min(chunk, size - off);
          }
        firstRates.push_back(bytes / (window / 1000.0) / 1e9);
      }
      if (worker.joinable()) {
        worker.join();
        helperSeconds.push_back(threadSeconds);
        dropRegions(mine, size);
      }
      if (other) {
        double hs = 0;
        if (!before) {
          if (read(h.back, &hs, sizeof hs) != (ssize_t)sizeof hs) return 1;
          helperSeconds.push_back(hs);
        }
        c = 'e';
        if (write(h.go, &c, 1) != 1) return 1;
        int status = 0;
        waitpid(h.pid, &status, 0);
        close(h.go);
        close(h.back);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          std::fprintf(stderr, "helper %s failed\n", mode);
          return 1;
        }
      }
      dropRegions(targets, size);
    }
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    std::sort(firstRates.begin(), firstRates.end());
    std::sort(helperSeconds.begin(), helperSeconds.end());
    std::printf("{\"mode\":\"%s\",\"streams\":%d,\"regions\":%d,\"regionMiB\":%zu,\"bytes\":%zu,\"h2dGBps\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
                "\"firstGBps\":%.2f,\"besideSeconds\":%.4f}\n",
                mode, streamCount, n, mib, total, sorted[sorted.size() / 2], sorted.front(), sorted.back(), firstRates[firstRates.size() / 2],
                helperSeconds.empty() ? 0.0 : helperSeconds[helperSeconds.size() / 2]);
    std::fflush(stdout);
  }
  CK(cuMemFreeHost(host));
  return 0;
}
