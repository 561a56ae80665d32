// Peak memory and descriptors of a pull against a hostile registry: a child process pulls from
// the registry of test/helpers/hostile-registry.ts (in this process) answering each way the
// client once trusted (endless or oversized manifest, config, error and token bodies; a 200 to
// a Range request on a large layer; large chunks over many connections; hundreds of blobs), and
// reports its own peak resident memory (VmHWM). Each answer must be refused with its code (or
// pulled, where the answer is legal) with memory growth under a generous limit that is still far
// below what the unbounded client reached: that one grew until killed. A watcher kills the child
// past KILL_AT_MIB, so the unbounded client cannot take the machine (CI has 24 GiB and 2 cores).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { OCI_MANIFEST } from '../../src/registry/artifact.js';
import { BODY_LIMITS } from '../../src/registry/http.js';
import { RegionStore } from '../../src/store/region-store.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { endless, oversized, serveBlob, servedArtifact, startHostileRegistry, syntheticArtifact, type Hostile, type ServedArtifact } from '../helpers/hostile-registry.js';
import { patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';
import { bundle } from './bundle.js';
import { FULL, record } from './figures.js';

const MiB = 2 ** 20;
const KILL_AT_MIB = FULL ? 6144 : 1536;
/**
 * The large layer: bounded run 256 MiB in 16 MiB chunks over 16 connections, a chunk buffer's
 * worth of maxBufferedBytes (the unbounded client held 16 chunks at once); full run 2 GiB in
 * 256 MiB chunks over 8 connections, the default maxBufferedBytes (256 MiB: one chunk).
 */
const LAYER = FULL ? { size: 2048 * MiB, chunk: 256 * MiB } : { size: 256 * MiB, chunk: 16 * MiB };
const CONNECTIONS = FULL ? 8 : 16;
/** The 200-to-Range answer makes part k read k/parts of the layer: 4 parts keep that to 2.5 layers. */
const RANGE_CONNECTIONS = 4;
const BUDGET = FULL ? {} : { maxBufferedBytes: LAYER.chunk };
/** Full run: 10,000 blobs (the 4 MiB manifest holds about 12,000 layers; the issue's 25,000 cannot be one artifact). */
const BLOBS = FULL ? 10_000 : 400;
const NOFILE = 128;

interface Outcome {
  outcome: string;
  message: string;
  baselineKiB: number;
  peakKiB: number;
  killed: boolean;
}

interface Line {
  answer: string;
  expected: string;
  outcome: string;
  baselineMiB: number;
  peakMiB: number;
  growthMiB: number;
  limitMiB: number;
}

let child = '';
const lines: Line[] = [];
const figures: Record<string, unknown> = {};
let large: ServedArtifact;
let small: ServedArtifact;

/** Source stores live for the whole file (tempDir's are removed after each test). */
const sources: string[] = [];

async function capture(sizes: Record<string, number>, chunkSize: number): Promise<RegionStore> {
  const dir = mkdtempSync(join(tmpdir(), 'vsnap-hostile-src-'));
  sources.push(dir);
  const store = await RegionStore.open(join(dir, 's'));
  const regions = patternedRegions(sizes);
  try {
    await Snapshot.capture(store, 'm', { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize });
  } finally {
    for (const r of regions.values()) r.close();
  }
  return store;
}

function vmRssMiB(pid: number): number {
  try {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

/** Runs the pull child against `reference`; a watcher kills it past KILL_AT_MIB of RSS. */
function pullInChild(reference: string, options: object, wrap: string[] = [], onSpawn: (pid: number) => void = () => undefined): Promise<Outcome> {
  const root = join(tempDir('vsnap-hostile-dst-'), 'd');
  return new Promise((resolve, reject) => {
    const argv = [...wrap, process.execPath, child, root, reference, JSON.stringify(options)];
    const p = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    onSpawn(p.pid!);
    let out = '';
    let killed = false;
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (out += d.toString()));
    // a safety net, not a measurement: how often it looks changes nothing the test asserts
    const watcher = setInterval(() => {
      if (vmRssMiB(p.pid!) > KILL_AT_MIB) {
        killed = true;
        p.kill('SIGKILL');
      }
    }, 50);
    p.on('error', reject);
    p.on('exit', () => {
      clearInterval(watcher);
      const line = out.split('\n').find((l) => l.startsWith('result '));
      const r = line ? (JSON.parse(line.slice(7)) as Omit<Outcome, 'killed'>) : { outcome: killed ? 'killed' : `no result: ${out.slice(-300)}`, message: '', baselineKiB: -1, peakKiB: KILL_AT_MIB * 1024 };
      resolve({ ...r, killed });
    });
  });
}

/** One hostile answer: the pull's outcome and its memory growth, recorded and checked. */
async function against(answer: string, artifact: ServedArtifact, hostile: Hostile, expected: string, limitMiB: number, options: object = {}): Promise<void> {
  const reg = await startHostileRegistry({ artifact, hostile });
  try {
    const r = await pullInChild(reg.reference, options);
    const line: Line = {
      answer,
      expected,
      outcome: r.killed ? `killed past ${KILL_AT_MIB} MiB` : r.outcome,
      baselineMiB: +(r.baselineKiB / 1024).toFixed(1),
      peakMiB: +(r.peakKiB / 1024).toFixed(1),
      growthMiB: +((r.peakKiB - r.baselineKiB) / 1024).toFixed(1),
      limitMiB,
    };
    lines.push(line);
    expect(r.killed, `${answer}: the pull grew past ${KILL_AT_MIB} MiB and was killed`).toBe(false);
    expect(r.outcome, `${answer}: ${r.message}`).toBe(expected);
    expect(line.growthMiB, `${answer}: peak ${line.peakMiB} MiB from ${line.baselineMiB} MiB`).toBeLessThan(limitMiB);
  } finally {
    await reg.close();
  }
}

const isLayer = (a: ServedArtifact, digest: string | undefined): boolean => digest !== undefined && a.blobs.get(digest)?.path !== undefined;
const configOf = (a: ServedArtifact): string => (JSON.parse(a.manifest.toString()) as { config: { digest: string } }).config.digest;

beforeAll(async () => {
  child = await bundle('pull-child.ts');
  small = await servedArtifact(await capture({ w: MiB }, 256 * 1024), 'm');
  large = await servedArtifact(await capture({ big: LAYER.size }, LAYER.chunk), 'm');
}, 300_000);
afterAll(() => {
  for (const dir of sources) rmSync(dir, { recursive: true, force: true });
  record('registry-hostile', { ...figures, layerMiB: LAYER.size / MiB, chunkMiB: LAYER.chunk / MiB, connections: CONNECTIONS, rangeConnections: RANGE_CONNECTIONS, killAtMiB: KILL_AT_MIB, lines });
});

describe('peak memory of a pull against a hostile registry (child VmHWM)', () => {
  // small bodies: the limits are 4 MiB (manifest), 1 MiB (token), 64 KiB (error), the config's own size
  const SMALL_LIMIT_MIB = 64;

  it('an endless manifest', async () => {
    await against('manifest: 200, endless body', small, (_q, res, route) => route.kind === 'manifest' && (endless(res, 200, { 'content-type': OCI_MANIFEST }), true), 'E_REGISTRY', SMALL_LIMIT_MIB);
  });

  it('a 200 MB manifest', async () => {
    await against('manifest: 200 MB (Content-Length)', small, (_q, res, route) => route.kind === 'manifest' && (oversized(res, 200, 200_000_000, { 'content-type': OCI_MANIFEST }), true), 'E_REGISTRY', SMALL_LIMIT_MIB);
  });

  it('an endless config blob', async () => {
    const config = configOf(small);
    await against('config: 200, endless body', small, (_q, res, route) => route.digest === config && (endless(res, 200), true), 'E_CHECKSUM', SMALL_LIMIT_MIB);
  });

  it('a 500 with an endless body', async () => {
    await against('manifest: 500, endless body', small, (_q, res, route) => route.kind === 'manifest' && (endless(res, 500, { 'content-type': 'text/plain' }, { piece: Buffer.alloc(64 * 1024, 0x61) }), true), 'E_REGISTRY', SMALL_LIMIT_MIB);
  });

  it('an endless token answer', async () => {
    let origin = '';
    const hostile: Hostile = (req, res, route) => {
      origin ||= `http://${req.headers.host}`;
      if (req.url?.startsWith('/token')) return endless(res, 200, { 'content-type': 'application/json' }), true;
      if (route.kind !== 'manifest' || req.headers.authorization) return false;
      res.writeHead(401, { 'www-authenticate': `Bearer realm="${origin}/token",service="hostile"`, 'content-length': '0' }).end();
      return true;
    };
    await against('token: 200, endless body', small, hostile, 'E_REGISTRY', SMALL_LIMIT_MIB);
  });

  it(`a 200 (the whole blob) to every Range request of a ${LAYER.size / MiB} MiB layer`, async () => {
    const limit = FULL ? 640 : 160;
    await against(
      `layer of ${LAYER.size / MiB} MiB: 200 to Range (${RANGE_CONNECTIONS} parts)`,
      large,
      (_q, res, route) => isLayer(large, route.digest) && (serveBlob(res, large.blobs.get(route.digest!)!, route.range, true), true),
      'ok',
      limit,
      { connections: RANGE_CONNECTIONS, rangeMinBytes: LAYER.chunk, ...BUDGET },
    );
  }, 300_000);

  it(`${LAYER.chunk / MiB} MiB chunks over ${CONNECTIONS} connections (a well-behaved registry)`, async () => {
    const limit = FULL ? 640 : 160;
    await against(
      `layer of ${LAYER.size / MiB} MiB in ${LAYER.chunk / MiB} MiB chunks, ${CONNECTIONS} connections, maxBufferedBytes ${FULL ? 'default (256 MiB)' : `${LAYER.chunk / MiB} MiB`}`,
      large,
      () => false,
      'ok',
      limit,
      { connections: CONNECTIONS, rangeMinBytes: LAYER.chunk, ...BUDGET },
    );
  }, 300_000);
});

describe('descriptors of a pull of many blobs', () => {
  it(`${BLOBS} distinct blobs under RLIMIT_NOFILE ${NOFILE}: pulled, descriptors bounded`, async () => {
    const many = syntheticArtifact(await (await capture({ w: 4096 }, 4096)).get('m'), BLOBS);
    let pid = 0;
    let peak = 0;
    const reg = await startHostileRegistry({
      artifact: many,
      hostile: (_q, _res, route) => {
        // sampled as each blob is asked for: the child's open descriptors
        if (route.kind === 'blob' && pid) {
          try {
            peak = Math.max(peak, readdirSync(`/proc/${pid}/fd`).length);
          } catch {
            /* exited */
          }
        }
        return false;
      },
    });
    let wrap: string[] = [];
    try {
      execFileSync('prlimit', ['--version'], { stdio: 'ignore' });
      wrap = ['prlimit', `--nofile=${NOFILE}:${NOFILE}`, '--'];
    } catch {
      /* no prlimit: the peak is still measured */
    }
    try {
      // (prlimit execs node in its own process: the pid is the pull's)
      const r = await pullInChild(reg.reference, { connections: 4 }, wrap, (p) => (pid = p));
      figures.blobs = { count: BLOBS, nofile: wrap.length ? NOFILE : 'unlimited (no prlimit)', outcome: r.outcome, peakDescriptors: peak };
      expect(r.outcome, r.message).toBe('ok');
      expect(peak).toBeLessThan(NOFILE);
    } finally {
      await reg.close();
    }
  }, 300_000);
});
