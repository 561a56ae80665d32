// Figures of the reliability suite: each test file records what it measured; report.mjs prints
// them (and writes them into docs/reliability.md, between its reliability markers).
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** `npm run test:reliability` sets VSNAP_RELIABILITY=full; `npm test` runs the bounded form. */
export const FULL = process.env.VSNAP_RELIABILITY === 'full';

/** Where figures are kept between the test run and the report (ignored by git). */
export const FIGURES_DIR = fileURLToPath(new URL('../../node_modules/.cache/vsnap-reliability/', import.meta.url));

/** Records the figures of one part of the suite (replacing that part's previous figures). */
export function record(part: string, figures: Record<string, unknown>): void {
  mkdirSync(FIGURES_DIR, { recursive: true });
  writeFileSync(join(FIGURES_DIR, `${part}.json`), `${JSON.stringify({ part, mode: FULL ? 'full' : 'bounded', at: new Date().toISOString(), ...figures }, null, 1)}\n`);
}

/** Every part's figures. */
export function readAll(): Array<Record<string, unknown>> {
  let files: string[] = [];
  try {
    files = readdirSync(FIGURES_DIR).filter((f) => f.endsWith('.json'));
  } catch {
    return [];
  }
  return files.sort().map((f) => JSON.parse(readFileSync(join(FIGURES_DIR, f), 'utf8')) as Record<string, unknown>);
}

/** A small seeded PRNG (mulberry32): trials are reproducible from the printed seed. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The seed of this run: VSNAP_RELIABILITY_SEED, else a fresh one (printed with the figures). */
export const SEED = Number(process.env.VSNAP_RELIABILITY_SEED ?? Math.floor(Math.random() * 2 ** 31));
