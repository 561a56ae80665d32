#!/usr/bin/env node
// Checks the import graph of src/ against the layers of docs/architecture.md: a file may import only
// from its own folder or from a folder of a lower layer, and no set of files may import each
// other in a circle (type-only imports count: a circle of types is still a circle of concepts).
// The bench (bench/) sits above cli: it may import only its own files and the package's entry
// points (src/index.ts, src/plumbing.ts, src/serve/index.ts, or their builds under dist/), and is
// in the circle check too. Exits 1 and lists every violation. `--print` prints the layers and the
// folder graph.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(repo, 'src');
const bench = join(repo, 'bench');

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
/** What a bench file may import outside bench/: the entry points, as sources or built. */
const BENCH_MAY_IMPORT = new Set([...ENTRY_POINTS].flatMap((e) => [join(root, e), join(repo, 'dist', e)]));

function walk(dir) {
  if (!existsSync(dir)) return [];
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

/** A bench file's imports that leave bench/ for anything but an entry point. */
function benchProblems(file, targets) {
  const rel = relative(repo, file);
  return targets
    .filter((t) => !t.startsWith(bench + '/') && !BENCH_MAY_IMPORT.has(t))
    .map((t) => `${rel}: imports ${relative(repo, t)} (the bench may import only its own files and the entry points: ${[...ENTRY_POINTS].map((e) => `src/${e}`).join(', ')})`);
}

export function check() {
  const files = walk(root);
  const benchFiles = walk(bench);
  const graph = new Map([...files, ...benchFiles].map((f) => [f, importsOf(f)]));
  const problems = [];
  for (const [file, targets] of graph) {
    if (file.startsWith(bench + '/')) {
      problems.push(...benchProblems(file, targets));
      continue;
    }
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
        component.push(relative(repo, w));
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
      if (file.startsWith(bench + '/')) continue;
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
  console.log(`layers: ${graph.size} files (src/ and bench/), no upward import, no circle`);
}
