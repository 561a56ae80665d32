import { defineConfig } from 'tsup';

// The library (ESM + CJS + types: the root, vsnap/plumbing and vsnap/serve) and the CLI (one ESM bundle with a shebang).
// `npm run build` (scripts/build.mjs) empties dist/ first, so neither config cleans the other's output.
// Source maps ship without the sources inside them (sourcesContent): src/ is not published, and
// embedding it made the maps 39% of the unpacked package; the mappings alone still let
// `node --enable-source-maps` name the TypeScript file and line in a stack trace.
const noSourcesContent = (options: { sourcesContent?: boolean }): void => {
  options.sourcesContent = false;
};
export default defineConfig([
  {
    entry: { index: 'src/index.ts', plumbing: 'src/plumbing.ts', 'serve/index': 'src/serve/index.ts' },
    format: ['esm', 'cjs'],
    dts: true,
    // vsnap/serve names the root's types through type-only imports of 'vsnap' (tsconfig paths: src/index.ts):
    // kept as imports, its declarations refer to the root's exports instead of copying them
    external: ['vsnap'],
    sourcemap: true,
    esbuildOptions: noSourcesContent,
    target: 'node20',
    platform: 'node',
    shims: true,
  },
  {
    entry: { 'cli/main': 'src/cli/main.ts' },
    format: ['esm'],
    sourcemap: true,
    esbuildOptions: noSourcesContent,
    target: 'node20',
    platform: 'node',
    banner: { js: '#!/usr/bin/env node' },
  },
]);
