import { deviceContexts } from './contexts.js';
import { releaseWarmNeighbours } from './multipath.js';
import { stagingPools } from './staging.js';
import { windowBuffers } from './window-buffers.js';

/**
 * Frees the staging memory vsnap keeps pinned between transfers (and the window buffers of
 * restores of coded store blobs), lets go of the CUDA contexts it
 * keeps for the GPUs it moved bytes to or from, and of the neighbour GPU contexts multi-path
 * restores keep (all otherwise freed after 30 s idle; `VSNAP_STAGING_IDLE_MS` changes that).
 * Call before a process that used vsnap hands the GPU to others, or in tests.
 * @public
 */
export async function releaseIdleResources(): Promise<void> {
  await stagingPools.releaseIdle();
  windowBuffers.releaseIdle();
  releaseWarmNeighbours();
  await deviceContexts.releaseIdle();
}
