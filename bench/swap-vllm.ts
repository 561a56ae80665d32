// The vllm-l1 row of `npm run bench -- swap`: vLLM's own level-1 sleep of the awake reference engine
// (`/sleep?level=1`, then `/wake_up`; dev routes), the peer vsnap's RAM tier must beat. With
// VSNAP_VLLM_SRC (bench/run.sh) the engine runs vLLM's allocator: level 1 copies every "weights"
// allocation into a pinned CPU backup (cumem.py `sleep`) and unmaps the GPU memory; `wake_up` maps
// it again, copies back and drops the backup (its pinned block stays in torch's host cache: what
// is still held after the wake is recorded too). Per cycle: sleep and wake wall time (the HTTP
// calls), the host memory held asleep (MemAvailable before the sleep minus while asleep: torch's
// pinned memory shows there, not always in VmRSS/VmLck, recorded too), the GPU memory held asleep
// (nvidia-smi, the engine core); after each wake the engine must answer the probe as before.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';

import { median, MiB, since } from './common.js';
import { vllmRoutes } from './engine.js';

export interface HostMemory {
  memAvailableBytes: number | null;
  /** The engine core's VmRSS, VmLck and VmPin (bytes), from /proc/<pid>/status. */
  process: Record<string, number>;
}

/** The `kB` fields of a /proc file that `pattern` names, in bytes; none where the file is gone (the process ended). */
function procKb(file: string, pattern: RegExp): Record<string, number> {
  let text = '';
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return {};
  }
  return Object.fromEntries([...text.matchAll(pattern)].map((m) => [m[1]!, Number(m[2]) * 1024]));
}

/** MemAvailable of the host, and the process's VmRSS, VmLck, VmPin, RssAnon and RssShmem. */
export function hostMemory(pid: number): HostMemory {
  return {
    memAvailableBytes: procKb('/proc/meminfo', /^(MemAvailable):\s+(\d+) kB/gm).MemAvailable ?? null,
    process: procKb(`/proc/${pid}/status`, /^(VmRSS|VmLck|VmPin|RssAnon|RssShmem):\s+(\d+) kB/gm),
  };
}

/** GPU memory nvidia-smi lists for `pid` (bytes), or null when it lists none or has no nvidia-smi. */
export function gpuBytesOf(pid: number): number | null {
  try {
    const out = execFileSync('nvidia-smi', ['--query-compute-apps=pid,used_memory', '--format=csv,noheader,nounits'], { encoding: 'utf8', timeout: 30_000 });
    const found = out
      .split('\n')
      .map((l) => l.split(',').map((x) => x.trim()))
      .filter((p) => p[0] === String(pid) && /^\d+$/.test(p[1] ?? ''));
    return found.length ? found.reduce((n, p) => n + Number(p[1]) * MiB, 0) : null;
  } catch {
    return null;
  }
}

export interface SleepCycle {
  index: number;
  sleepSeconds: number;
  wakeSeconds: number;
  /** MemAvailable before the first sleep minus while asleep: host memory the sleeping engine holds. */
  hostHeldBytes: number | null;
  /** MemAvailable before the first sleep minus after this wake: what stays held once awake (torch's host cache keeps freed pinned blocks). */
  hostHeldAfterWakeBytes: number | null;
  /** Deltas of the engine core's /proc status fields, asleep minus before. */
  processDeltaBytes: Record<string, number>;
  gpuBytesAwake: number | null;
  gpuBytesAsleep: number | null;
  answerSame: boolean;
}

export interface VllmLevel1Result {
  skipped: string | null;
  allocator: string;
  cycles: SleepCycle[];
  summary: {
    firstSleepSeconds: number;
    laterSleepMedianSeconds: number | null;
    wakeMedianSeconds: number;
    hostHeldBytes: number | null;
    hostHeldAfterWakeBytes: number | null;
    gpuBytesAsleep: number | null;
  } | null;
}

/** The upper median of the values present, or null for none. */
const medianOf = (v: ReadonlyArray<number | null>): number | null => {
  const present = v.filter((x): x is number => x !== null);
  return present.length ? median(present) : null;
};
const delta = (a: number | null, b: number | null): number | null => (a === null || b === null ? null : a - b);

/** `cycles` level-1 sleep/wake cycles of the awake engine; `ask` gives its probe answer, compared with `answer`. */
export async function runVllmLevel1(url: string, enginePid: number, cycles: number, answer: unknown, ask: () => Promise<unknown>, log: (m: string) => void): Promise<VllmLevel1Result> {
  const allocator = process.env.VSNAP_VLLM_SRC ? `vLLM's own (VSNAP_VLLM_SRC=${process.env.VSNAP_VLLM_SRC})` : "the reference engine's stand-in (no VSNAP_VLLM_SRC)";
  const client = vllmRoutes(url);
  if (await client.isSleeping()) return { skipped: 'the engine to measure is asleep', allocator, cycles: [], summary: null };
  const out: SleepCycle[] = [];
  // One baseline for every cycle: after the first, torch's host allocator keeps the freed backup
  // blocks, so "before this sleep" would hide what the engine holds.
  const baseline = hostMemory(enginePid);
  for (let i = 0; i < cycles; i++) {
    const before = hostMemory(enginePid);
    const gpuBytesAwake = gpuBytesOf(enginePid);
    let t = performance.now();
    await client.sleep(1);
    const sleepSeconds = since(t);
    const asleep = hostMemory(enginePid);
    const gpuBytesAsleep = gpuBytesOf(enginePid);
    t = performance.now();
    await client.wakeUp();
    const wakeSeconds = since(t);
    const after = hostMemory(enginePid);
    const answerSame = isDeepStrictEqual(await ask(), answer);
    const processDeltaBytes: Record<string, number> = {};
    for (const [k, v] of Object.entries(asleep.process)) if (before.process[k] !== undefined) processDeltaBytes[k] = v - before.process[k]!;
    const cycle: SleepCycle = {
      index: i, sleepSeconds, wakeSeconds,
      hostHeldBytes: delta(baseline.memAvailableBytes, asleep.memAvailableBytes),
      hostHeldAfterWakeBytes: delta(baseline.memAvailableBytes, after.memAvailableBytes),
      processDeltaBytes, gpuBytesAwake, gpuBytesAsleep, answerSame,
    };
    out.push(cycle);
    const g = (b: number | null): string => (b === null ? 'n/a' : `${(b / 2 ** 30).toFixed(2)} GiB`);
    log(
      `[vllm-l1] cycle ${i}: sleep ${(sleepSeconds * 1000).toFixed(0)} ms, wake ${(wakeSeconds * 1000).toFixed(0)} ms; host held asleep ${g(cycle.hostHeldBytes)} ` +
        `(after wake ${g(cycle.hostHeldAfterWakeBytes)}), GPU ${g(gpuBytesAwake)} -> ${g(gpuBytesAsleep)} asleep; answer ${answerSame ? 'same' : 'DIFFERENT'}`,
    );
    if (!answerSame) throw new Error(`[vllm-l1] cycle ${i}: the engine answers differently after vLLM's level-1 wake`);
  }
  return {
    skipped: null, allocator, cycles: out,
    summary: {
      firstSleepSeconds: out[0]!.sleepSeconds,
      laterSleepMedianSeconds: medianOf(out.slice(1).map((c) => c.sleepSeconds)),
      wakeMedianSeconds: median(out.map((c) => c.wakeSeconds)),
      hostHeldBytes: medianOf(out.map((c) => c.hostHeldBytes)),
      hostHeldAfterWakeBytes: out.at(-1)!.hostHeldAfterWakeBytes,
      gpuBytesAsleep: medianOf(out.map((c) => c.gpuBytesAsleep)),
    },
  };
}
