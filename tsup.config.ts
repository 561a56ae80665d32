import { defineConfig } from 'tsup';

// The library (ESM + CJS + types; the root, vsnap/plumbing and vsnap/serve) and the CLI (one ESM bundle with a shebang).
// `npm run build` empties dist/ first, so neither config cleans the other's output.
export default defineConfig([
  {
    entry: { index: 'src/index.ts', plumbing: 'src/plumbing.ts', 'serve/index': 'src/serve/index.ts' },
    format: ['esm', 'cjs'],
    dts: true,
    sourcemap: true,
    target: 'node20',
    platform: 'node',
    shims: true,
  },
  {
    entry: { 'cli/main': 'src/cli/main.ts' },
    format: ['esm'],
    sourcemap: true,
    target: 'node20',
    platform: 'node',
    banner: { js: '#!/usr/bin/env node' },
  },
]);
