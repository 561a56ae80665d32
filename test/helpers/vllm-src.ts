// What the vLLM allocator code that VSNAP_VLLM_SRC points at can do (test/gpu/vllm-allocator.sh
// builds the reference engine on it; test/fixtures/engine/vllm_src.py lays the folder out).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** The allocator module of VSNAP_VLLM_SRC (either of vLLM's layouts), or undefined without one. */
function vllmAllocatorFile(src: string | undefined = process.env['VSNAP_VLLM_SRC']): string | undefined {
  if (!src) return undefined;
  return [join(src, 'vllm/device_allocator/cumem.py'), join(src, 'vllm/backends/platform/device_allocator/cumem.py')].find((f) => existsSync(f));
}

/**
 * Why the engine's own tier 0 cannot run on VSNAP_VLLM_SRC's allocator, or undefined when it can
 * (or no VSNAP_VLLM_SRC is set: the stand-in's allocator has discard). vLLM's
 * release_kv_cache_memory ends in the allocator's discard(tags), which came with it (PR #44890):
 * an allocator taken before then cannot run it, and no vLLM pairs that allocator with the route.
 */
export function engineTierUnsupported(src: string | undefined = process.env['VSNAP_VLLM_SRC']): string | undefined {
  const cumem = vllmAllocatorFile(src);
  if (!cumem || /def discard\(/.test(readFileSync(cumem, 'utf8'))) return undefined;
  return `VSNAP_VLLM_SRC's allocator (${cumem}) has no discard(tags): it predates release_kv_cache_memory; run without VSNAP_VLLM_SRC for this`;
}
