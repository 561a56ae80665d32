#!/usr/bin/env node
// Checks the import graph of src/ against the layers of docs/architecture.md: a file may import only
// from its own folder or from a folder of a lower layer, and no set of files may import each
// other in a circle (type-only imports count: a circle of types is still a circle of concepts).
// Exits 1 and lists every violation. `--print` prints the layers and the folder graph.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../src');

/**
 * The layers, lowest first. A folder imports only from folders listed before it; the files at the
 * top of src/ (errors, version, options, settings) are the floor; the entry points (index, plumbing, serve's
 * index) may import anything.
 */
export const LAYERS = [
  '.', // errors.ts, version.ts, options.ts, settings.ts
  'native', // loads and types the addon
  'gpu', // CUDA availability, devices, device allocations
  'ipc', // descriptor passing
  'regions', // memory a transfer reads or writes
  'transfer', // bulk copies through the staging pool
  'manifest', // what a snapshot is, and the compatibility check
  'digest', // GPU digests, and comparing memory with a manifest's
  'engine', // the engine's HTTP API and its exported regions
  'store', // RegionStore: blobs and manifests on disk
  'cache', // what holds weights outside the engine: RAM tier, tier 0, neighbour GPU
  'snapshot', // Snapshot: capture and restore of regions
  'registry', // push and pull
  'tiers', // the tiers behind one interface, as the flows use them
  'flows', // capture, suspend, restore and swap a running engine
  'swap', // SwapController: planner, state, executor
  'serve', // the application: config, supervisor, HTTP agent, status page
  'cli', // the vsnap command
];
const ENTRY_POINTS = new Set(['index.ts', 'plumbing.ts', 'serve/index.ts']);

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return walk(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** The top folder of a file under src/ ('.' for files at the top). */
function folderOf(file) {
  const rel = relative(root, file);
  return rel.includes('/') ? rel.split('/')[0] : '.';
}

function importsOf(file) {
  const text = readFileSync(file, 'utf8');
  const specs = [...text.matchAll(/^\s*(?:import|export)\s[^;]*?\sfrom\s+'([^']+)'/gms), ...text.matchAll(/^\s*import\s+'([^']+)'/gm)].map((m) => m[1]);
  return specs
    .filter((s) => s.startsWith('.'))
    .map((s) => resolve(dirname(file), s.replace(/\.js$/, '.ts')))
    .filter((target, i, all) => all.indexOf(target) === i);
}

export function check() {
  const files = walk(root);
  const graph = new Map(files.map((f) => [f, importsOf(f)]));
  const problems = [];
  for (const [file, targets] of graph) {
    const rel = relative(root, file);
    const from = folderOf(file);
    const fromRank = LAYERS.indexOf(from);
    if (fromRank < 0) problems.push(`${rel}: folder '${from}' is in no layer (add it to LAYERS in scripts/check-layers.mjs and to docs/architecture.md)`);
    for (const target of targets) {
      if (!graph.has(target)) {
        problems.push(`${rel}: imports ${relative(root, target)}, which does not exist`);
        continue;
      }
      if (ENTRY_POINTS.has(rel)) continue;
      const to = folderOf(target);
      if (to === from) continue;
      const toRank = LAYERS.indexOf(to);
      if (toRank > fromRank) problems.push(`${rel}: imports ${relative(root, target)} (layer '${to}' is above '${from}')`);
    }
  }
  // Circles: strongly connected components of more than one file (Tarjan).
  let index = 0;
  const stack = [];
  const meta = new Map();
  const circles = [];
  const visit = (v) => {
    meta.set(v, { index, low: index, on: true });
    index++;
    stack.push(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!meta.has(w)) {
        visit(w);
        meta.get(v).low = Math.min(meta.get(v).low, meta.get(w).low);
      } else if (meta.get(w).on) meta.get(v).low = Math.min(meta.get(v).low, meta.get(w).index);
    }
    if (meta.get(v).low === meta.get(v).index) {
      const component = [];
      let w;
      do {
        w = stack.pop();
        meta.get(w).on = false;
        component.push(relative(root, w));
      } while (w !== v);
      if (component.length > 1) circles.push(component.sort());
    }
  };
  for (const f of graph.keys()) if (!meta.has(f)) visit(f);
  for (const c of circles) problems.push(`import circle: ${c.join(' <-> ')}`);
  return { problems, graph };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { problems, graph } = check();
  if (process.argv.includes('--print')) {
    const edges = new Map();
    for (const [file, targets] of graph) {
      for (const t of targets) {
        const a = folderOf(file);
        const b = folderOf(t);
        if (a !== b && !ENTRY_POINTS.has(relative(root, file))) edges.set(`${a} -> ${b}`, (edges.get(`${a} -> ${b}`) ?? 0) + 1);
      }
    }
    console.log(`layers, lowest first: ${LAYERS.join(' < ')}`);
    for (const [e, n] of [...edges].sort()) console.log(`  ${e} (${n})`);
  }
  if (problems.length) {
    console.error(`layers: ${problems.length} problem(s):\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    process.exit(1);
  }
  console.log(`layers: ${graph.size} files, no upward import, no circle`);
}
