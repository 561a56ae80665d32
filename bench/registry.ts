// Pull rate from a local registry into the store, against curl fetching the same blob from the
// same registry in the same run. CPU only: the CNCF distribution registry (Debian's
// docker-registry) on loopback, plain HTTP, anonymous.
//   npm run bench -- registry [GiB] [out-dir]
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { RegionStore, RegistryClient, Snapshot } from '../src/index.js';
import { HostRegion } from '../src/plumbing.js';

const gib = Number(process.argv[2] ?? '2');
const outDir = process.argv[3];
const GiB = 1024 ** 3;
const size = Math.round(gib * GiB / 4096) * 4096;
const dir = mkdtempSync(join(tmpdir(), 'vsnap-bench-registry-'));
const rate = (bytes: number, s: number): number => bytes / s / 1e9;

/** The distribution registry on a loopback port, plain HTTP, anonymous, storing under `dir`. */
async function startRegistry(): Promise<{ host: string; prefix: string; close(): Promise<void> }> {
  const port = await new Promise<number>((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const p = (server.address() as { port: number }).port;
      server.close(() => resolve(p));
    });
  });
  const config = `version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: ${join(dir, 'storage')}\nhttp:\n  addr: 127.0.0.1:${port}\n  secret: bench\n`;
  writeFileSync(join(dir, 'config.yml'), config);
  const child = spawn('docker-registry', ['serve', join(dir, 'config.yml')], { stdio: 'ignore' });
  const host = `127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    if ((await fetch(`http://${host}/v2/`).then((r) => r.ok, () => false)) || i > 300) break;
    if (child.exitCode !== null) throw new Error(`docker-registry exited (${child.exitCode}): is Debian's docker-registry installed?`);
    await sleep(50);
  }
  return { host, prefix: `http://${host}`, close: () => new Promise<void>((r) => (child.exitCode !== null ? r() : (child.once('exit', () => r()), child.kill('SIGTERM')))) };
}

const reg = await startRegistry();
try {
  const src = await RegionStore.open(join(dir, 'src'));
  const region = HostRegion.create(size, 'w');
  const piece = Buffer.alloc(64 * 1024 * 1024);
  for (let off = 0; off < size; off += piece.length) {
    piece.fill((off / piece.length) & 0xff);
    piece.writeUInt32LE(off >>> 0, 0);
    region.write(off, piece.subarray(0, Math.min(piece.length, size - off)));
  }
  await Snapshot.capture(src, 'bench', { regions: [{ key: 'w', size, memory: region.memory }], chunkSize: 16 * 1024 * 1024 });
  region.close();
  const registry = new RegistryClient({ stateDir: join(dir, 'state'), dockerConfig: false });
  const ref = `${reg.prefix}/bench/w:v1`;
  const pushed = await registry.push(src, 'bench', ref);
  // The region's blob as the registry names it: the one layer of the manifest just pushed.
  const manifest = await fetch(`http://${reg.host}/v2/bench/w/manifests/${pushed.digest}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
  const url = `http://${reg.host}/v2/bench/w/blobs/${((await manifest.json()) as { layers: Array<{ digest: string }> }).layers[0]!.digest}`;

  const rows: Array<{ what: string; bytes: number; seconds: number; gbps: number }> = [];
  const curl = (what: string, out: string): void => {
    const [bytes, secs] = execFileSync('curl', ['-sS', '-o', out, '-w', '%{size_download} %{time_total}', url], { encoding: 'utf8' }).trim().split(' ').map(Number);
    rows.push({ what, bytes: bytes!, seconds: secs!, gbps: rate(bytes!, secs!) });
    if (out !== '/dev/null') rmSync(out);
  };
  const pull = async (what: string, options: ConstructorParameters<typeof RegistryClient>[0]): Promise<void> => {
    const root = join(dir, `dst-${rows.length}`);
    const store = await RegionStore.open(root);
    const r = await new RegistryClient({ dockerConfig: false, stateDir: join(dir, 'state'), ...options }).pull(store, ref);
    rows.push({ what, bytes: r.bytesDownloaded, seconds: r.seconds, gbps: rate(r.bytesDownloaded, r.seconds) });
    rmSync(root, { recursive: true, force: true });
  };
  // the registry's file is in the page cache after the push and the first read: every row reads it warm
  curl('curl -> /dev/null (warm-up)', '/dev/null');
  curl('curl -> /dev/null', '/dev/null');
  curl('curl -> file (same disk as the store)', join(dir, 'curl.out'));
  await pull('vsnap pull, 1 connection (sha256 + xxh3 per chunk, fsync, publish)', { connections: 1 });
  await pull('vsnap pull, 4 Range connections', { connections: 4, rangeMinBytes: 1 });
  const result = {
    date: new Date().toISOString(),
    host: { cpus: cpus().length, cpu: cpus()[0]?.model, node: process.version },
    registry: execFileSync('docker-registry', ['--version'], { encoding: 'utf8' }).trim(),
    blobBytes: size,
    push: { seconds: pushed.seconds, gbps: rate(pushed.bytesUploaded, pushed.seconds) },
    rows,
  };
  const md = [
    `# Registry pull vs curl, ${(size / GiB).toFixed(2)} GiB blob, ${result.host.cpus} CPUs (${result.host.cpu}), ${result.registry}`,
    '',
    `push (hash + upload in 64 MiB PATCHes): ${pushed.seconds.toFixed(2)} s, ${result.push.gbps.toFixed(3)} GB/s`,
    '',
    '| what | bytes | seconds | GB/s |',
    '|---|---|---|---|',
    ...rows.map((r) => `| ${r.what} | ${r.bytes} | ${r.seconds.toFixed(2)} | ${r.gbps.toFixed(3)} |`),
  ].join('\n');
  console.log(md);
  if (outDir) {
    mkdirSync(outDir, { recursive: true });
    const base = join(outDir, `${result.date.slice(0, 10)}-cpu-registry-${gib}GiB`);
    writeFileSync(`${base}.json`, `${JSON.stringify(result, null, 2)}\n`);
    writeFileSync(`${base}.md`, `${md}\n`);
    console.log(`written: ${base}.json, ${base}.md (${statSync(`${base}.json`).size} bytes)`);
  }
} finally {
  await reg.close();
  rmSync(dir, { recursive: true, force: true });
}
