import { homedir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { VsnapError } from '../errors.js';
import { cudaStatus, formatCudaVersion, listDevices } from '../gpu/cuda.js';
import { native } from '../native/index.js';
import { RegionStore } from '../store/region-store.js';
import { VERSION } from '../version.js';
import { runDemo } from './demo.js';
import { formatBytes, formatRate, progressLine } from './output.js';

/** Exit codes (also in the README). */
const EXIT = { ok: 0, failed: 1, usage: 2, verifyFailed: 3 } as const;

const HELP = `vsnap ${VERSION}: snapshot and restore GPU memory regions of inference engines

Usage: vsnap <command> [options]

Commands:
  demo                 capture, wipe, restore and check a few regions (GPU if present, else host memory)
  doctor               report CUDA, devices, checksum speed path and the store's state
  ls                   list snapshots in the store
  verify <name>        re-hash every blob of a snapshot against its manifest
  rm <name>            remove a snapshot (or one capture with --id) and free unreferenced blobs
  gc                   delete blobs no snapshot references

Options:
  --store <dir>        the store (default: $VSNAP_STORE, else $XDG_DATA_HOME/vsnap, else ~/.local/share/vsnap)
  --id <id>            a specific capture of a snapshot (verify, rm)
  --json               machine-readable output
  --size <MiB>         demo: total bytes to move (default 1024)
  --cpu                demo: use host memory even when a GPU is present
  -h, --help           this text
  -v, --version        the version

Exit codes: 0 ok, 1 failed (the error code and what to do are printed), 2 bad usage,
3 verification found damage.`;

function defaultStore(): string {
  if (process.env.VSNAP_STORE) return process.env.VSNAP_STORE;
  const data = process.env.XDG_DATA_HOME || join(homedir(), '.local', 'share');
  return join(data, 'vsnap');
}

async function main(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        store: { type: 'string' },
        id: { type: 'string' },
        json: { type: 'boolean', default: false },
        size: { type: 'string' },
        cpu: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
        version: { type: 'boolean', short: 'v', default: false },
      },
    });
  } catch (err) {
    console.error(`${(err as Error).message}\n\n${HELP}`);
    return EXIT.usage;
  }
  const { values, positionals } = parsed;
  if (values.version) {
    console.log(VERSION);
    return EXIT.ok;
  }
  const [command, ...rest] = positionals;
  if (values.help || !command) {
    console.log(HELP);
    return command || values.help ? EXIT.ok : EXIT.usage;
  }
  const storeRoot = values.store ?? defaultStore();
  const print = (human: string, json: unknown): void => console.log(values.json ? JSON.stringify(json, null, 2) : human);
  const needName = (): string => {
    if (!rest[0]) throw new UsageError(`${command} needs a snapshot name`);
    return rest[0];
  };

  switch (command) {
    case 'demo': {
      const totalMiB = values.size === undefined ? 1024 : Number(values.size);
      if (!Number.isInteger(totalMiB) || totalMiB < 1) throw new UsageError('--size must be a whole number of MiB >= 1');
      const ok = await runDemo({ totalMiB, cpu: values.cpu, ...(values.store ? { store: values.store } : {}) });
      return ok ? EXIT.ok : EXIT.verifyFailed;
    }
    case 'doctor': {
      const status = await cudaStatus();
      const devices = status.available ? await listDevices({ freeMemory: true }) : [];
      let store: Record<string, unknown>;
      try {
        const s = await RegionStore.open(storeRoot);
        const usage = await s.usage();
        const { statfsSync } = await import('node:fs');
        const fs = statfsSync(storeRoot);
        store = { root: storeRoot, ok: true, snapshots: (await s.list()).length, ...usage, freeBytes: fs.bavail * fs.bsize };
      } catch (err) {
        store = { root: storeRoot, ok: false, error: (err as Error).message };
      }
      const report = {
        version: VERSION,
        node: process.versions.node,
        checksum: { algorithm: native().checksumAlgorithm, implementation: native().checksumImplementation },
        cuda: status,
        devices,
        store,
      };
      const lines = [
        `vsnap ${VERSION} on Node ${process.versions.node}`,
        `checksums: ${report.checksum.algorithm} (${report.checksum.implementation})`,
        status.available
          ? `cuda: driver supports CUDA ${formatCudaVersion(status.driverVersion)}; checkpoint API ${status.checkpointApi ? 'present' : 'absent (driver < r570)'}`
          : `cuda: unavailable: ${status.reason}`,
        ...devices.map(
          (d) =>
            `  gpu ${d.ordinal}: ${d.name} (${d.uuid}, cc ${d.computeCapability}), ${formatBytes(d.freeMemory ?? 0)} free of ${formatBytes(d.totalMemory)}, ` +
            `VMM ${d.vmmSupported ? `granularity ${formatBytes(d.vmmGranularity)}` : 'unsupported'}, POSIX-FD handles ${d.posixFdHandlesSupported ? 'yes' : 'no'}`,
        ),
        store.ok
          ? `store: ${storeRoot}: ${store.snapshots} snapshot(s), ${formatBytes(store.bytes as number)} in ${store.blobs} blob(s), ${formatBytes(store.freeBytes as number)} free`
          : `store: ${storeRoot}: ${store.error}`,
      ];
      print(lines.join('\n'), report);
      return store.ok ? EXIT.ok : EXIT.failed;
    }
    case 'ls': {
      const store = await RegionStore.open(storeRoot, { create: false });
      const list = await store.list();
      const human = list.length
        ? list.map((s) => `${s.name}\t${s.id}\t${s.createdAt}\t${formatBytes(s.bytes)}\t${s.regions} regions\t${s.versions} capture(s)`).join('\n')
        : `no snapshots in ${storeRoot}`;
      print(human, list);
      return EXIT.ok;
    }
    case 'verify': {
      const name = needName();
      const store = await RegionStore.open(storeRoot, { create: false });
      const progress = progressLine('verify');
      const report = await store.verify(name, { ...(values.id ? { id: values.id } : {}), onProgress: progress.update });
      progress.done();
      const human = report.ok
        ? `${report.name} (${report.id}): ok, ${formatBytes(report.bytes)} verified in ${report.seconds.toFixed(2)} s (${formatRate(report.bytes, report.seconds)})`
        : [`${report.name} (${report.id}): DAMAGED, ${report.problems.length} problem(s):`, ...report.problems.map((p) => `  - rank ${p.rank} ${p.region}: [${p.code}] ${p.message}`)].join('\n');
      print(human, report);
      return report.ok ? EXIT.ok : EXIT.verifyFailed;
    }
    case 'rm': {
      const name = needName();
      const store = await RegionStore.open(storeRoot, { create: false });
      const removed = await store.remove(name, values.id ? { id: values.id } : {});
      const gc = await store.gc();
      print(`removed ${removed.join(', ')}; freed ${formatBytes(gc.bytesFreed)} in ${gc.blobsRemoved} blob(s)`, { removed, ...gc });
      return EXIT.ok;
    }
    case 'gc': {
      const store = await RegionStore.open(storeRoot, { create: false });
      const gc = await store.gc();
      print(`freed ${formatBytes(gc.bytesFreed)} in ${gc.blobsRemoved} blob(s)`, gc);
      return EXIT.ok;
    }
    default:
      throw new UsageError(`unknown command '${command}'`);
  }
}

class UsageError extends Error {}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    if (err instanceof UsageError) {
      console.error(`vsnap: ${err.message}\nRun \`vsnap --help\` for usage.`);
      process.exitCode = EXIT.usage;
    } else if (err instanceof VsnapError) {
      console.error(`vsnap: [${err.code}] ${err.message}`);
      process.exitCode = EXIT.failed;
    } else {
      console.error(err);
      process.exitCode = EXIT.failed;
    }
  },
);
