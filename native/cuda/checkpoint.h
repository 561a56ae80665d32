// The driver's process checkpoint API (cuCheckpointProcess*, driver r570+): lock, checkpoint,
// restore and unlock another CUDA process by pid. The calls block the calling thread (a
// checkpoint of a few GiB takes seconds), so the bindings run them off the JS thread.
#pragma once

#include <string>
#include <vector>

namespace vsnap::cuda::checkpoint {

// CUprocessState as text: running, locked, checkpointed, failed.
std::string state(int pid);

// cuCheckpointProcessLock; timeoutMs 0 waits without limit. On timeout the process stays running.
void lock(int pid, unsigned timeoutMs);
// cuCheckpointProcessCheckpoint: the process must be locked; its GPU memory moves to host RAM.
void checkpoint(int pid);
// One GPU of a remapping restore: the GPU the process was checkpointed on and the GPU to
// restore it onto, as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form).
struct GpuPair {
  std::string oldUuid;
  std::string newUuid;
};

// The CUDA version (cuDriverGetVersion) of the first driver with GPU pairs in the restore
// arguments: r580 (CUDA 13.0).
constexpr int kGpuPairsDriverVersion = 13000;

// cuCheckpointProcessRestore: the process must be checkpointed; it comes back locked. With
// pairs (driver r580+, E_CHECKPOINT_UNSUPPORTED before), its GPUs are remapped: the driver wants
// every GPU the process was checkpointed with in the list, and the new GPUs of the same chip.
void restore(int pid, const std::vector<GpuPair>& pairs = {});
// cuCheckpointProcessUnlock: the process must be locked; it may make CUDA calls again.
void unlock(int pid);

}  // namespace vsnap::cuda::checkpoint
