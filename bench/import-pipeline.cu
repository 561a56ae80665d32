// How fast one process can import, map and copy into memory another process made (a restore via
// exported fds, issue 25 target 5), arranged several ways. A child process (the engine) makes
// <regions> exportable allocations of <MiB> each, maps them, exports each as a POSIX fd and hands
// the fds over a socket; this process (the SDK) then, per arrangement, from a pinned buffer:
//   mapped        copies into as many allocations of its own, made and mapped before the clock
//                 (the copy alone: the floor for this many regions)
//   premapped     imports and maps the child's allocations before the clock, then copies (the copy
//                 into imported memory alone)
//   open-<T>      imports on T threads, one reservation, maps on T threads, one access call; no copy
//                 (each stage's wall time is reported)
//   beside-<T>    `mapped`'s copy while another thread does `open-<T>` of the child's allocations
//   pipe          vsnap's pipelined form (transfer/region_pipeline.cc): chunks of 16, 32, then 64
//                 regions, each imported on 4 threads, reserved, mapped on 4 threads, one access
//                 call; the copy into region i starts once its chunk is done
//   pipe-ahead-<T> the imports run ahead on T threads of their own, in region order; one mapper
//                 reserves, maps and sets access chunk by chunk (16, 32, ... 512) as their imports
//                 land; the copy as in `pipe`
//   pipe-flat-<K> as `pipe` with every chunk K regions
//   pipe-cap-<K>  as `pipe` with chunks growing from 16 to at most K regions (pipe-cap-512: the
//                 pipelined form up to 51f0c35)
//   make          vsnap's filled form, this side alone: this process makes exportable memory in
//                 parts of 64 regions (create, reserve, map, access, export), the copy into each
//                 part starting once it is accessible (stages: import = create, reserve = export)
//   fill          `make` with the child adopting each part beside the copy (import, map at
//                 addresses it reserved before, access): timed until both the copy and the adopt
//                 are done; "besideCopyMs" is the copy's end
// Every copy is 64 MiB chunks on one stream, as the hydrate issues them. Medians of <reps>; one JSON
// line per arrangement. argv: <reps> <regions> <region MiB> [arrangement...]
// Build: nvcc -O2 -o import-pipeline bench/import-pipeline.cu -lcuda -lpthread
#include <cuda.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cuda-bench.h"

static CUcontext g_ctx;
static size_t g_size = 0;  // one region's bytes (a multiple of the granularity)
static const size_t kChunk = 64ull << 20;

// Runs fn(i) for i in [0, n) on `threads` threads (the caller's included).
static void parallel(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> cursor{0};
  auto work = [&] {
    CK(cuCtxSetCurrent(g_ctx));
    for (size_t i; (i = cursor.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; t++) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

// ---- the child: the engine's allocations, exported ----
// A message of one byte in *iov whose control data (the descriptors) is `control`.
static msghdr fdMessage(iovec* iov, std::vector<char>& control) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  return msg;
}

static void sendFds(int sock, const int* fds, size_t n) {
  char byte = 'f';
  iovec iov{&byte, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * n));
  msghdr msg = fdMessage(&iov, control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  if (sendmsg(sock, &msg, 0) != 1) std::exit(2);
}

static size_t recvFds(int sock, int* out, size_t max) {
  char byte;
  iovec iov{&byte, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * max));
  msghdr msg = fdMessage(&iov, control);
  if (recvmsg(sock, &msg, 0) != 1) std::exit(3);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) std::exit(3);
  size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
  std::memcpy(out, CMSG_DATA(c), sizeof(int) * n);
  return n;
}

static int child(int sock, int n, size_t size) {
  context();
  CUmemAllocationProp p = prop(true);
  CUmemAccessDesc a = access();
  std::vector<CUmemGenericAllocationHandle> hs(n);
  std::vector<CUdeviceptr> vas(n);
  std::vector<int> fds(n);
  for (int i = 0; i < n; i++) {
    CK(cuMemCreate(&hs[i], size, &p, 0));
    CK(cuMemAddressReserve(&vas[i], size, 0, 0, 0));
    CK(cuMemMap(vas[i], size, 0, hs[i], 0));
    CK(cuMemSetAccess(vas[i], size, &a, 1));
    CK(cuMemExportToShareableHandle(&fds[i], hs[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }
  for (int i = 0; i < n; i += 200) sendFds(sock, &fds[i], std::min(200, n - i));
  for (int fd : fds) close(fd);
  char c;
  // 'a': adopt the parent's memory as it is sent (the plugin's adopt: import, map at addresses
  // reserved before, set access per part received), answer 'd'; then on 'u' let it go, answer 'u'.
  while (read(sock, &c, 1) == 1 && c == 'a') {
    CUdeviceptr base;
    CK(cuMemAddressReserve(&base, (size_t)n * size, 0, 0, 0));
    std::vector<CUmemGenericAllocationHandle> got(n);
    std::vector<int> in(n);
    for (int have = 0; have < n;) {
      int k = (int)recvFds(sock, &in[have], n - have);
      for (int i = have; i < have + k; i++) {
        CK(cuMemImportFromShareableHandle(&got[i], (void*)(uintptr_t)in[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(in[i]);
        CK(cuMemMap(base + (size_t)i * size, size, 0, got[i], 0));
      }
      CK(cuMemSetAccess(base + (size_t)have * size, (size_t)k * size, &a, 1));
      have += k;
    }
    c = 'd';
    if (write(sock, &c, 1) != 1 || read(sock, &c, 1) != 1 || c != 'u') return 1;
    CK(cuMemUnmap(base, (size_t)n * size));
    CK(cuMemAddressFree(base, (size_t)n * size));
    for (auto h : got) CK(cuMemRelease(h));
    if (write(sock, &c, 1) != 1) return 1;
  }
  for (int i = 0; i < n; i++) {
    CK(cuMemUnmap(vas[i], size));
    CK(cuMemAddressFree(vas[i], size));
    CK(cuMemRelease(hs[i]));
  }
  return 0;
}

// ---- the parent ----
struct Opened {
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<CUdeviceptr> vas;
  std::vector<std::pair<CUdeviceptr, size_t>> reservations;
  void close() {
    for (size_t i = 0; i < vas.size(); i++)
      if (vas[i]) CK(cuMemUnmap(vas[i], g_size));
    for (auto& r : reservations) CK(cuMemAddressFree(r.first, r.second));
    for (auto h : handles)
      if (h) CK(cuMemRelease(h));
    handles.clear();
    vas.clear();
    reservations.clear();
  }
};

struct Stages {
  double import = 0, reserve = 0, map = 0, access = 0;
};

// Imports, reserves, maps and sets access of fds[begin, end) as one batch (vsnap's openBatched).
static void openBatch(Opened& o, const std::vector<int>& fds, size_t begin, size_t end, int threads, Stages* st, bool importDone = false) {
  auto t = Clock::now();
  if (!importDone)
    parallel(end - begin, threads, [&](size_t k) {
      size_t i = begin + k;
      CK(cuMemImportFromShareableHandle(&o.handles[i], (void*)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    });
  if (st) st->import += since(t);
  t = Clock::now();
  CUdeviceptr base;
  size_t bytes = (end - begin) * g_size;
  CK(cuMemAddressReserve(&base, bytes, 0, 0, 0));
  o.reservations.push_back({base, bytes});
  if (st) st->reserve += since(t);
  t = Clock::now();
  parallel(end - begin, threads, [&](size_t k) {
    size_t i = begin + k;
    CUdeviceptr va = base + k * g_size;
    CK(cuMemMap(va, g_size, 0, o.handles[i], 0));
    o.vas[i] = va;
  });
  if (st) st->map += since(t);
  t = Clock::now();
  CUmemAccessDesc a = access();
  CK(cuMemSetAccess(base, bytes, &a, 1));
  if (st) st->access += since(t);
}

// Copies region after region as `ready` allows (64 MiB chunks, one stream), then waits for the copy.
static void copyAll(const std::vector<CUdeviceptr>& vas, const char* host, CUstream s, const std::atomic<size_t>* ready, double* waited) {
  size_t n = vas.size();
  auto w = Clock::duration::zero();
  for (size_t i = 0; i < n; i++) {
    if (ready && ready->load(std::memory_order_acquire) <= i) {
      auto t = Clock::now();
      while (ready->load(std::memory_order_acquire) <= i) std::this_thread::yield();
      w += Clock::now() - t;
    }
    for (size_t off = 0; off < g_size; off += kChunk) CK(cuMemcpyHtoDAsync(vas[i] + off, host + i * g_size + off, std::min(kChunk, g_size - off), s));
  }
  CK(cuStreamSynchronize(s));
  if (waited) *waited = std::chrono::duration<double>(w).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  int n = argc > 2 ? std::atoi(argv[2]) : 4000;
  size_t mib = argc > 3 ? std::atoll(argv[3]) : 4;
  g_size = mib << 20;
  if (reps < 1 || n < 1 || mib < 2 || mib % 2 != 0) {
    // cuMemCreate wants a multiple of the VMM granularity (2 MiB on H100 and H200)
    std::fprintf(stderr, "usage: import-pipeline <reps >= 1> <regions >= 1> <region MiB, even> [arrangement...]\n");
    return 2;
  }
  std::vector<std::string> arrangements = {"mapped", "premapped", "open-1", "open-2", "open-4", "open-8", "beside-4", "pipe",
                                           "pipe-ahead-4", "pipe-flat-64", "pipe-cap-128", "pipe-cap-512", "make", "fill"};
  if (argc > 4) arrangements.assign(argv + 4, argv + argc);
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if ((rlim_t)n + 64 > rl.rlim_cur) {
    std::fprintf(stderr, "%d regions need %d fds; the limit is %llu\n", n, n + 64, (unsigned long long)rl.rlim_cur);
    return 1;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1;
  pid_t pid = fork();  // before any CUDA call here
  if (pid == 0) {
    close(sv[0]);
    return child(sv[1], n, g_size);
  }
  close(sv[1]);
  std::vector<int> fds(n);
  for (int got = 0; got < n;) got += (int)recvFds(sv[0], &fds[got], n - got);

  g_ctx = context();
  size_t total = g_size * n;
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  void* hostp = nullptr;
  CK(cuMemHostAlloc(&hostp, total, CU_MEMHOSTALLOC_PORTABLE));
  std::memset(hostp, 1, total);
  const char* host = (const char*)hostp;
  // this process's own regions, for `mapped` and `beside-*`
  std::vector<CUmemGenericAllocationHandle> own(n);
  std::vector<CUdeviceptr> ownVa(n);
  {
    CUmemAllocationProp p = prop(false);
    CUmemAccessDesc a = access();
    for (int i = 0; i < n; i++) {
      CK(cuMemCreate(&own[i], g_size, &p, 0));
      CK(cuMemAddressReserve(&ownVa[i], g_size, 0, 0, 0));
      CK(cuMemMap(ownVa[i], g_size, 0, own[i], 0));
      CK(cuMemSetAccess(ownVa[i], g_size, &a, 1));
    }
  }
  copyAll(ownVa, host, s, nullptr, nullptr);  // warm-up: first touch of the pinned pages and the mappings

  for (const std::string& arr : arrangements) {
    std::vector<double> wall, waits, copyOnly;
    Stages sum;
    for (int rep = 0; rep < reps; rep++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      Opened o;
      o.handles.assign(n, 0);
      o.vas.assign(n, 0);
      double waited = 0, copySeconds = 0;
      Clock::time_point t0;
      if (arr == "mapped") {
        t0 = Clock::now();
        copyAll(ownVa, host, s, nullptr, nullptr);
      } else if (arr == "premapped") {
        openBatch(o, fds, 0, n, 4, nullptr);
        t0 = Clock::now();
        copyAll(o.vas, host, s, nullptr, nullptr);
      } else if (arr.rfind("open-", 0) == 0) {
        t0 = Clock::now();
        openBatch(o, fds, 0, n, std::atoi(arr.c_str() + 5), &sum);
      } else if (arr.rfind("beside-", 0) == 0) {
        Stages st;
        std::thread opener([&] {
          CK(cuCtxSetCurrent(g_ctx));
          openBatch(o, fds, 0, n, std::atoi(arr.c_str() + 7), &st);
        });
        t0 = Clock::now();
        copyAll(ownVa, host, s, nullptr, nullptr);
        copySeconds = since(t0);
        opener.join();
        sum.import += st.import;
        sum.reserve += st.reserve;
        sum.map += st.map;
        sum.access += st.access;
      } else if (arr == "pipe" || arr.rfind("pipe-flat-", 0) == 0 || arr.rfind("pipe-cap-", 0) == 0) {
        size_t flat = arr.rfind("pipe-flat-", 0) == 0 ? (size_t)std::atoi(arr.c_str() + 10) : 0;
        size_t cap = arr.rfind("pipe-cap-", 0) == 0 ? (size_t)std::atoi(arr.c_str() + 9) : 64;
        std::atomic<size_t> ready{0};
        t0 = Clock::now();
        std::thread opener([&] {
          CK(cuCtxSetCurrent(g_ctx));
          for (size_t next = 0, chunk = flat ? flat : 16; next < (size_t)n; next += chunk, chunk = flat ? flat : std::min<size_t>(chunk * 2, cap)) {
            size_t end = std::min<size_t>(n, next + chunk);
            openBatch(o, fds, next, end, 4, &sum);
            ready.store(end, std::memory_order_release);
          }
        });
        copyAll(o.vas, host, s, &ready, &waited);
        opener.join();
      } else if (arr.rfind("pipe-ahead-", 0) == 0) {
        int threads = std::atoi(arr.c_str() + 11);
        std::atomic<size_t> ready{0};
        std::vector<std::atomic<bool>> imported(n);
        for (auto& x : imported) x.store(false);
        t0 = Clock::now();
        std::atomic<size_t> cursor{0};
        std::vector<std::thread> importers;
        for (int t = 0; t < threads; t++)
          importers.emplace_back([&] {
            CK(cuCtxSetCurrent(g_ctx));
            for (size_t i; (i = cursor.fetch_add(1)) < (size_t)n;) {
              CK(cuMemImportFromShareableHandle(&o.handles[i], (void*)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
              imported[i].store(true, std::memory_order_release);
            }
          });
        std::thread mapper([&] {
          CK(cuCtxSetCurrent(g_ctx));
          for (size_t next = 0, chunk = 16; next < (size_t)n; next += chunk, chunk = std::min<size_t>(chunk * 2, 512)) {
            size_t end = std::min<size_t>(n, next + chunk);
            for (size_t i = next; i < end; i++)
              while (!imported[i].load(std::memory_order_acquire)) std::this_thread::yield();
            openBatch(o, fds, next, end, 1, &sum, true);
            ready.store(end, std::memory_order_release);
          }
        });
        copyAll(o.vas, host, s, &ready, &waited);
        mapper.join();
        for (auto& t : importers) t.join();
      } else if (arr == "make" || arr == "fill") {
        // vsnap's filled form: this process makes the memory in parts of 64 regions (create, one
        // reservation, map, one access call, export), the copy following part by part; with `fill`
        // each part's fds go to the child, which adopts them beside the copy.
        const bool adopt = arr == "fill";
        std::vector<int> made(n, -1);
        std::atomic<size_t> ready{0};
        char c = 'a';
        if (adopt && write(sv[0], &c, 1) != 1) return 1;
        t0 = Clock::now();
        std::thread maker([&] {
          CK(cuCtxSetCurrent(g_ctx));
          CUmemAllocationProp p = prop(true);
          CUmemAccessDesc a = access();
          for (size_t next = 0; next < (size_t)n; next += 64) {
            size_t end = std::min<size_t>(n, next + 64), k = end - next;
            auto t = Clock::now();
            for (size_t i = next; i < end; i++) CK(cuMemCreate(&o.handles[i], g_size, &p, 0));
            sum.import += since(t);  // reported as "import": the create
            t = Clock::now();
            CUdeviceptr base;
            CK(cuMemAddressReserve(&base, k * g_size, 0, 0, 0));
            o.reservations.push_back({base, k * g_size});
            for (size_t i = next; i < end; i++) {
              CK(cuMemMap(base + (i - next) * g_size, g_size, 0, o.handles[i], 0));
              o.vas[i] = base + (i - next) * g_size;
            }
            sum.map += since(t);
            t = Clock::now();
            CK(cuMemSetAccess(base, k * g_size, &a, 1));
            sum.access += since(t);
            ready.store(end, std::memory_order_release);
            t = Clock::now();
            for (size_t i = next; i < end; i++) CK(cuMemExportToShareableHandle(&made[i], o.handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
            sum.reserve += since(t);  // reported as "reserve": the export
            if (adopt) sendFds(sv[0], &made[next], k);
          }
        });
        copyAll(o.vas, host, s, &ready, &waited);
        copySeconds = since(t0);
        maker.join();
        if (adopt && (read(sv[0], &c, 1) != 1 || c != 'd')) return 1;
        wall.push_back(since(t0));
        if (adopt) {
          c = 'u';
          if (write(sv[0], &c, 1) != 1 || read(sv[0], &c, 1) != 1) return 1;
        }
        for (int fd : made) close(fd);
        waits.push_back(waited);
        copyOnly.push_back(copySeconds);
        o.close();
        continue;
      } else {
        std::fprintf(stderr, "unknown arrangement %s\n", arr.c_str());
        return 1;
      }
      wall.push_back(since(t0));
      waits.push_back(waited);
      copyOnly.push_back(copySeconds);
      o.close();
    }
    double w = median(wall);
    std::printf("{\"arrangement\":\"%s\",\"regions\":%d,\"regionMiB\":%zu,\"bytes\":%zu,\"wallMs\":%.1f,\"minMs\":%.1f,\"GBps\":%.2f,"
                "\"copyWaitedMs\":%.1f,\"besideCopyMs\":%.1f,\"stagesMsPerRep\":{\"import\":%.1f,\"reserve\":%.1f,\"map\":%.1f,\"access\":%.1f}}\n",
                arr.c_str(), n, mib, total, w * 1e3, *std::min_element(wall.begin(), wall.end()) * 1e3, total / w / 1e9, median(waits) * 1e3,
                median(copyOnly) * 1e3, sum.import / reps * 1e3, sum.reserve / reps * 1e3, sum.map / reps * 1e3, sum.access / reps * 1e3);
    std::fflush(stdout);
  }
  for (int i = 0; i < n; i++) {
    CK(cuMemUnmap(ownVa[i], g_size));
    CK(cuMemAddressFree(ownVa[i], g_size));
    CK(cuMemRelease(own[i]));
  }
  for (int fd : fds) close(fd);
  char c = 'e';
  if (write(sv[0], &c, 1) != 1) return 1;
  int status = 0;
  waitpid(pid, &status, 0);
  CK(cuMemFreeHost(hostp));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
