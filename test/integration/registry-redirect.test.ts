import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { join } from 'node:path';

import { request } from 'undici';
import { describe, expect, it } from 'vitest';

import { RegistryClient } from '../../src/registry/registry.js';
import { RegionStore } from '../../src/store/region-store.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { patternedRegions } from '../helpers/regions.js';
import { registryAvailable, startRegistry } from '../helpers/registry.js';
import { tempDir } from '../helpers/tmp.js';

// What cloud registries do on blob GETs: a redirect to object storage on another origin. A
// front in front of the real registry answers blob GETs with a 307 to an "object store" on
// another port, which serves the bytes (Range included) and records what it was sent.
const MiB = 1024 * 1024;
const run = registryAvailable();
const user = { name: 'alice', password: 'wonderland' };
const basic = `Basic ${Buffer.from(`${user.name}:${user.password}`).toString('base64')}`;

async function listen(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ server: Server; origin: string }> {
  const server = createServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, origin: `http://127.0.0.1:${(server.address() as { port: number }).port}` };
}

async function forward(to: string, req: IncomingMessage, res: ServerResponse, headers: Record<string, string>, asOrigin?: string): Promise<void> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const up = await request(`${to}${req.url}`, { method: req.method as 'GET', headers, ...(chunks.length ? { body: Buffer.concat(chunks) } : {}) });
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(up.headers)) if (v !== undefined && k !== 'transfer-encoding' && k !== 'connection') out[k] = v;
  // upload Locations name the registry's own address: rewritten to the front's
  if (asOrigin && typeof out.location === 'string') out.location = out.location.replace(to, asOrigin);
  res.writeHead(up.statusCode, out);
  for await (const c of up.body) res.write(c);
  res.end();
}

describe.skipIf(!run)('registry: blob downloads redirected to another origin', () => {
  it('follows the redirect, sends Range there, and never forwards Authorization', async () => {
    const dir = tempDir();
    const reg = await startRegistry(dir, { auth: 'htpasswd', user });
    const objectRequests: Array<{ url: string; authorization?: string | undefined; range?: string | undefined }> = [];
    const objects = await listen((req, res) => {
      objectRequests.push({ url: req.url ?? '', authorization: req.headers.authorization, range: req.headers.range });
      const digest = new URL(req.url ?? '/', 'http://x').pathname.split('/').pop()!;
      const headers: Record<string, string> = { authorization: basic, ...(req.headers.range ? { range: req.headers.range } : {}) };
      req.url = `/v2/redirect/m/blobs/${digest}`;
      forward(`http://${reg.host}`, req, res, headers).catch(() => res.destroy());
    });
    const front = await listen((req, res) => {
      if (req.method === 'GET' && /\/blobs\/sha256:/.test(req.url ?? '')) {
        const digest = (req.url ?? '').split('/').pop();
        res.writeHead(307, { location: `${objects.origin}/bucket/${digest}?X-Signature=test` }).end();
        return;
      }
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers)) if (typeof v === 'string' && k !== 'host' && k !== 'connection') headers[k] = v;
      forward(`http://${reg.host}`, req, res, headers, frontOrigin).catch(() => res.destroy());
    });
    const frontOrigin = front.origin;
    try {
      const store = await RegionStore.open(join(dir, 's'));
      const regions = patternedRegions({ w: 2 * MiB, v: MiB });
      await Snapshot.capture(store, 'm', { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize: 256 * 1024 });
      for (const r of regions.values()) r.close();
      const ref = `http://${front.origin.slice(7)}/redirect/m:v1`;
      const client = new RegistryClient({ credentials: { username: user.name, password: user.password }, dockerConfig: false, stateDir: join(dir, 'state'), rangeMinBytes: MiB, connections: 2 });
      await client.push(store, 'm', ref);
      const dst = await RegionStore.open(join(dir, 'd'));
      await client.pull(dst, ref);
      expect((await dst.verify('m')).ok).toBe(true);
      expect(objectRequests.length).toBeGreaterThanOrEqual(4); // config, the 1 MiB blob, the 2 MiB one in 2 ranges
      expect(objectRequests.some((r) => r.range?.startsWith('bytes='))).toBe(true);
      expect(objectRequests.filter((r) => r.authorization !== undefined)).toEqual([]);
    } finally {
      await new Promise((r) => front.server.close(r));
      await new Promise((r) => objects.server.close(r));
      await reg.close();
    }
  }, 30_000);
});
