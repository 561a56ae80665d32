// Bundles a child script of the suite from src/ (with esbuild, as tsup builds dist/): a child
// that loads only what it uses starts in about half the time of one importing dist/index.js,
// which matters when hundreds of children are killed.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { build } from 'esbuild';

import { FIGURES_DIR } from './figures.js';

export async function bundle(entry: string): Promise<string> {
  const dir = join(FIGURES_DIR, '..', 'vsnap-reliability-bin');
  mkdirSync(dir, { recursive: true });
  const outfile = join(dir, entry.replace(/\.ts$/, '.mjs'));
  await build({
    entryPoints: [fileURLToPath(new URL(`./${entry}`, import.meta.url))],
    outfile,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    packages: 'external',
    logLevel: 'warning',
  });
  return outfile;
}
