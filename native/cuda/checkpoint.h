// The driver's process checkpoint API (cuCheckpointProcess*, driver r570+): lock, checkpoint,
// restore and unlock another CUDA process by pid. The calls block the calling thread (a
// checkpoint of a few GiB takes seconds), so the bindings run them off the JS thread.
#pragma once

#include <string>

namespace vsnap::cuda::checkpoint {

// CUprocessState as text: running, locked, checkpointed, failed.
std::string state(int pid);

// cuCheckpointProcessLock; timeoutMs 0 waits without limit. On timeout the process stays running.
void lock(int pid, unsigned timeoutMs);
// cuCheckpointProcessCheckpoint: the process must be locked; its GPU memory moves to host RAM.
void checkpoint(int pid);
// cuCheckpointProcessRestore: the process must be checkpointed; it comes back locked.
void restore(int pid);
// cuCheckpointProcessUnlock: the process must be locked; it may make CUDA calls again.
void unlock(int pid);

}  // namespace vsnap::cuda::checkpoint
