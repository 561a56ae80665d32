import { execFileSync } from 'node:child_process';

/** GPU memory a process holds, as nvidia-smi sees it (MiB), or null if it is not listed. */
export function gpuMemoryOf(pid: number): number | null {
  try {
    const out = execFileSync('nvidia-smi', ['--query-compute-apps=pid,used_memory', '--format=csv,noheader,nounits'], { encoding: 'utf8' });
    const row = out.split('\n').map((l) => l.split(',').map((x) => x.trim())).find(([p]) => Number(p) === pid);
    return row ? Number(row[1]) : null;
  } catch {
    return null;
  }
}

/** GPU memory in use on the first visible GPU, as nvidia-smi sees it (MiB). */
export function gpuUsedMiB(): number {
  return Number(execFileSync('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits'], { encoding: 'utf8' }).trim().split('\n')[0]);
}

/** GPU memory in use on every visible GPU, in nvidia-smi's order (MiB). */
export function gpuUsedPerGpuMiB(): number[] {
  return execFileSync('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits'], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .map(Number);
}
