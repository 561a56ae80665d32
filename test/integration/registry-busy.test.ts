import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { BUSY_MAX_WAIT_MS, BUSY_RETRIES, busyWaitMs } from '../../src/registry/http.js';
import { RegistryClient } from '../../src/registry/registry.js';
import { RegionStore } from '../../src/store/region-store.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { servedArtifact, startHostileRegistry, type HostileRegistry, type Route } from '../helpers/hostile-registry.js';
import { patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

// A registry answering 429 (rate limited) with Retry-After: the pull waits as asked and goes on,
// a bounded number of times, under its signal. The waits here are 0 and 1 s: the outcome does
// not depend on how long anything takes.
const MiB = 1024 * 1024;
let reg: HostileRegistry | undefined;
afterEach(async () => {
  await reg?.close();
  reg = undefined;
});

/** A registry serving a 1 MiB snapshot that answers `busy(route, n)` (n: the nth request of that kind) first. */
async function busyRegistry(busy: (route: Route, n: number) => Record<string, string> | undefined): Promise<HostileRegistry> {
  const src = await RegionStore.open(join(tempDir(), 's'));
  const regions = patternedRegions({ w: MiB });
  await Snapshot.capture(src, 'm', { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })) });
  for (const r of regions.values()) r.close();
  const seen = new Map<string, number>();
  return startHostileRegistry({
    artifact: await servedArtifact(src, 'm'),
    hostile: (_req, res, route) => {
      const n = (seen.get(route.kind) ?? 0) + 1;
      seen.set(route.kind, n);
      const headers = busy(route, n);
      if (!headers) return false;
      res.writeHead(429, { 'content-type': 'application/json', ...headers }).end('{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}');
      return true;
    },
  });
}
const pull = async (signal?: AbortSignal) =>
  new RegistryClient({ dockerConfig: false, stateDir: join(tempDir(), 'state') }).pull(await RegionStore.open(join(tempDir(), 'd')), reg!.reference, signal ? { signal } : {});

describe('a registry that answers 429', () => {
  it('Retry-After: 1 on the manifest and on a layer: the pull waits, asks again, and completes', async () => {
    reg = await busyRegistry((route, n) => ((route.kind === 'manifest' || route.kind === 'blob') && n === 1 ? { 'retry-after': '1' } : undefined));
    const report = await pull();
    expect(report.name).toBe('m');
    expect(reg.requests.filter((r) => r.kind === 'manifest')).toHaveLength(2);
  });

  it(`always 429: E_REGISTRY after ${BUSY_RETRIES} retries, saying the registry is busy`, async () => {
    reg = await busyRegistry((route) => (route.kind === 'manifest' ? { 'retry-after': '0' } : undefined));
    const err = (await pull().catch((e: unknown) => e)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(err.code).toBe('E_REGISTRY');
    expect(err.message).toMatch(new RegExp(`is busy: HTTP 429 \\(Retry-After: 0\\).*asked ${BUSY_RETRIES + 1} times`));
    expect(reg.requests.filter((r) => r.kind === 'manifest')).toHaveLength(BUSY_RETRIES + 1);
  });

  it('a Retry-After longer than vsnap waits: fails at once, naming it', async () => {
    reg = await busyRegistry((route) => (route.kind === 'manifest' ? { 'retry-after': '3600' } : undefined));
    const err = (await pull().catch((e: unknown) => e)) as VsnapError;
    expect(err.code).toBe('E_REGISTRY');
    expect(err.message).toMatch(/Retry-After: 3600\).*not retried/);
    expect(reg.requests.filter((r) => r.kind === 'manifest')).toHaveLength(1);
  });

  it('the wait ends with the pull\'s signal', async () => {
    reg = await busyRegistry((route) => (route.kind === 'manifest' ? { 'retry-after': '60' } : undefined));
    const abort = new AbortController();
    const pending = pull(abort.signal).catch((e: unknown) => e);
    while (reg.requests.filter((r) => r.kind === 'manifest').length === 0) await new Promise((r) => setImmediate(r));
    abort.abort();
    expect(((await pending) as VsnapError).code).toBe('E_ABORTED');
  });

  it('reads Retry-After as seconds or an HTTP date, and backs off without one (429 only)', () => {
    const now = Date.parse('2026-12-07T12:00:00Z');
    expect(busyWaitMs(429, '2', 0, now)).toBe(2000);
    expect(busyWaitMs(429, 'Mon, 07 Dec 2026 12:00:05 GMT', 0, now)).toBe(5000);
    expect(busyWaitMs(429, 'Mon, 07 Dec 2026 11:00:00 GMT', 0, now)).toBe(0);
    expect(busyWaitMs(429, undefined, 2, now)).toBe(4000);
    expect(busyWaitMs(503, undefined, 0, now)).toBeUndefined();
    expect(busyWaitMs(503, '1', 0, now)).toBe(1000);
    expect(busyWaitMs(429, String(BUSY_MAX_WAIT_MS / 1000 + 1), 0, now)).toBeUndefined();
    expect(busyWaitMs(429, 'soon', 0, now)).toBeUndefined();
    expect(busyWaitMs(500, '1', 0, now)).toBeUndefined();
  });
});
