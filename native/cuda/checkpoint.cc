#include "cuda/checkpoint.h"

#include <signal.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/driver.h"

namespace vsnap::cuda::checkpoint {
namespace {

// The table, or E_CHECKPOINT_UNSUPPORTED saying why there is none (no driver, or one before r570).
const Api& checkpointApi() {
  const Status& s = status();
  if (!s.available) {
    throw NativeError("E_CHECKPOINT_UNSUPPORTED",
                      "deep suspend needs the CUDA driver's process checkpoint API, and CUDA is unavailable here: " +
                          s.reason + ". Suspend without deep (the engine keeps its CUDA context on the GPU).",
                      {{"reason", s.reason}});
  }
  if (!s.checkpointApi) {
    throw NativeError("E_CHECKPOINT_UNSUPPORTED",
                      "the NVIDIA driver (version " + std::to_string(s.driverVersion) +
                          ") lacks the process checkpoint API (cuCheckpointProcess*, driver r570 or newer on Linux). "
                          "Upgrade the driver, or suspend without deep.",
                      {{"driverVersion", static_cast<int64_t>(s.driverVersion)}});
  }
  return api();
}

// Whether pid is alive, and if not why: "" (alive), "gone" or "permission".
std::string probeProcess(int pid) {
  if (::kill(pid, 0) == 0) return "";
  return errno == ESRCH ? "gone" : errno == EPERM ? "permission" : "";
}

// Throws E_CHECKPOINT naming the call, the pid, the driver's error and what to do.
void checkResult(CUresult r, const char* call, int pid) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  const Api& a = api();
  if (a.cuGetErrorName) a.cuGetErrorName(r, &name);
  if (a.cuGetErrorString) a.cuGetErrorString(r, &text);
  std::string error = name ? name : "CUresult " + std::to_string(static_cast<int>(r));
  std::string process = probeProcess(pid);
  std::string reason;
  std::string advice;
  if (process == "gone") {
    reason = "gone";
    advice = "the process has exited; restart the engine (its snapshot brings the weights back).";
  } else if (process == "permission" || r == CUDA_ERROR_NOT_PERMITTED) {
    reason = "permission";
    advice = "this process may not control it: run vsnap as the engine's user (or root).";
  } else if (r == CUDA_ERROR_NOT_READY) {
    reason = "timeout";
    advice = "the process did not reach a point where it could be locked in time (a CUDA call in flight); "
             "it was left running. Retry with a longer timeout, or drain its work first.";
  } else if (r == CUDA_ERROR_ILLEGAL_STATE) {
    reason = "state";
    advice = "the process is not in the state this step needs; read its state (getState) and act on it.";
  } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    reason = "memory";
    advice = "a GPU it is restored onto lacks the memory the process had; it stays checkpointed. Free memory "
             "there (or restore it onto another GPU), then retry.";
  } else if (r == CUDA_ERROR_NOT_SUPPORTED) {
    reason = "unsupported";
    advice = "the driver refused to checkpoint this process (unsupported memory such as IPC or NVLS mappings).";
  } else {
    reason = "driver";
    advice = "check that the pid is a CUDA process of this machine (one with a CUDA context).";
  }
  throw NativeError("E_CHECKPOINT",
                    std::string(call) + "(pid " + std::to_string(pid) + ") failed: " + error +
                        (text ? std::string(" (") + text + ")" : "") + "; " + advice,
                    {{"call", std::string(call)}, {"pid", static_cast<int64_t>(pid)}, {"cudaError", error},
                     {"cudaErrorNumber", static_cast<int64_t>(r)}, {"reason", reason}});
}

}  // namespace

std::string state(int pid) {
  const Api& a = checkpointApi();
  CUprocessState s = CU_PROCESS_STATE_RUNNING;
  checkResult(a.cuCheckpointProcessGetState(pid, &s), "cuCheckpointProcessGetState", pid);
  switch (s) {
    case CU_PROCESS_STATE_RUNNING: return "running";
    case CU_PROCESS_STATE_LOCKED: return "locked";
    case CU_PROCESS_STATE_CHECKPOINTED: return "checkpointed";
    case CU_PROCESS_STATE_FAILED: return "failed";
  }
  return "unknown";
}

void lock(int pid, unsigned timeoutMs) {
  const Api& a = checkpointApi();
  CUcheckpointLockArgs args;
  std::memset(&args, 0, sizeof args);  // reserved fields must be zero
  args.timeoutMs = timeoutMs;
  checkResult(a.cuCheckpointProcessLock(pid, &args), "cuCheckpointProcessLock", pid);
}

void checkpoint(int pid) {
  const Api& a = checkpointApi();
  CUcheckpointCheckpointArgs args;
  std::memset(&args, 0, sizeof args);
  checkResult(a.cuCheckpointProcessCheckpoint(pid, &args), "cuCheckpointProcessCheckpoint", pid);
}

namespace {

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "GPU-" and 32 hex digits in groups 8-4-4-4-12, as nvidia-smi and listDevices print it.
CUuuid parseUuid(const std::string& text) {
  static const char* kForm = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
  CUuuid id;
  std::memset(&id, 0, sizeof id);
  bool ok = text.size() == std::strlen(kForm) && text.compare(0, 4, "GPU-") == 0;
  int byte = 0;
  for (size_t i = 4; ok && i < text.size();) {
    if (kForm[i] == '-') {
      ok = text[i] == '-';
      ++i;
      continue;
    }
    int hi = hexValue(text[i]);
    int lo = hexValue(text[i + 1]);
    ok = hi >= 0 && lo >= 0;
    if (ok) id.bytes[byte++] = static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  if (!ok || byte != 16) {
    throw NativeError("E_INVALID_ARGUMENT", "a GPU UUID must read GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (as nvidia-smi -L prints it), not '" + text + "'",
                      {{"uuid", text}});
  }
  return id;
}

}  // namespace

void restore(int pid, const std::vector<GpuPair>& pairs) {
  const Api& a = checkpointApi();
  // Parsed before the driver is asked anything, so a malformed pair changes nothing.
  std::vector<CUcheckpointGpuPair> raw;
  raw.reserve(pairs.size());
  for (const GpuPair& p : pairs) {
    CUcheckpointGpuPair pair;
    std::memset(&pair, 0, sizeof pair);
    pair.oldUuid = parseUuid(p.oldUuid);
    pair.newUuid = parseUuid(p.newUuid);
    raw.push_back(pair);
  }
  if (!raw.empty() && status().driverVersion < kGpuPairsDriverVersion) {
    // Before r580 the pairs' place in the arguments was reserved (must be zero): refuse here
    // rather than let the driver reject or ignore them.
    throw NativeError("E_CHECKPOINT_UNSUPPORTED",
                      "restoring a process onto other GPUs needs GPU pairs in the restore arguments (driver r580, CUDA 13.0, or newer), "
                      "and this driver supports CUDA " + std::to_string(status().driverVersion) +
                          ". Upgrade the driver, or restore the engine onto the GPUs it was suspended on (no GPU map).",
                      {{"driverVersion", static_cast<int64_t>(status().driverVersion)}, {"reason", std::string("pairs")}});
  }
  CUcheckpointRestoreArgs args;
  std::memset(&args, 0, sizeof args);  // reserved fields must be zero; no pairs: back onto its own GPUs
  if (!raw.empty()) {
    args.gpuPairs = raw.data();
    args.gpuPairsCount = static_cast<unsigned>(raw.size());
  }
  checkResult(a.cuCheckpointProcessRestore(pid, &args), "cuCheckpointProcessRestore", pid);
}

void unlock(int pid) {
  const Api& a = checkpointApi();
  CUcheckpointUnlockArgs args;
  std::memset(&args, 0, sizeof args);
  checkResult(a.cuCheckpointProcessUnlock(pid, &args), "cuCheckpointProcessUnlock", pid);
}

}  // namespace vsnap::cuda::checkpoint
