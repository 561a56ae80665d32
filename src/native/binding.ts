import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { VsnapError } from '../errors.js';
import type { NativeBinding } from './types.js';

/** The ABI the TypeScript side was written against (native/addon.cc's abiVersion). */
const EXPECTED_ABI = 3;

const requireHere = createRequire(import.meta.url);

/**
 * One place the addon was looked for, and why it was not used.
 * @internal
 */
export interface LoadAttempt {
  source: string;
  path?: string;
  error: string;
}

/**
 * The package root: the nearest directory above this file whose package.json is vsnap's.
 * Works from src/ (tests), dist/ and dist/cli/.
 * @internal
 */
export function packageRoot(from: string = dirname(fileURLToPath(import.meta.url))): string {
  let dir = from;
  for (;;) {
    const manifest = join(dir, 'package.json');
    if (existsSync(manifest)) {
      try {
        if ((JSON.parse(readFileSync(manifest, 'utf8')) as { name?: string }).name === 'vsnap') return dir;
      } catch {
        // unreadable package.json: keep walking up
      }
    }
    const parent = dirname(dir);
    if (parent === dir) return resolve(from, '..', '..');
    dir = parent;
  }
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message.split('\n')[0]! : String(err);
}

/**
 * Loads the addon, trying in order: `$VSNAP_NATIVE_PATH` (an explicit .node file), then
 * node-gyp-build over the package root (build/Release, build/Debug, then prebuilds/ for this
 * platform). Throws one E_NATIVE_LOAD error listing every attempt and what to do.
 * @internal
 */
export function loadBinding(root: string = packageRoot(), env: NodeJS.ProcessEnv = process.env): NativeBinding {
  const attempts: LoadAttempt[] = [];
  const candidates: Array<{ source: string; path: () => string }> = [];
  if (env.VSNAP_NATIVE_PATH) {
    candidates.push({ source: 'VSNAP_NATIVE_PATH', path: () => resolve(env.VSNAP_NATIVE_PATH!) });
  }
  candidates.push({
    source: 'node-gyp-build',
    path: () => (requireHere('node-gyp-build') as { path(dir: string): string }).path(root),
  });
  for (const candidate of candidates) {
    let path: string | undefined;
    try {
      path = candidate.path();
      if (!existsSync(path)) throw new Error(`no file at ${path}`);
      const binding = requireHere(path) as NativeBinding;
      if (binding.abiVersion !== EXPECTED_ABI) {
        throw new Error(`addon ABI ${binding.abiVersion} does not match the JavaScript (${EXPECTED_ABI}): rebuild it`);
      }
      return binding;
    } catch (err) {
      attempts.push({ source: candidate.source, ...(path ? { path } : {}), error: describe(err) });
    }
  }
  const lines = attempts.map((a) => `  - ${a.source}${a.path ? ` (${a.path})` : ''}: ${a.error}`);
  throw new VsnapError(
    'E_NATIVE_LOAD',
    [
      `Could not load the vsnap native addon for ${process.platform}-${process.arch}, Node ${process.versions.node}.`,
      'Tried:',
      ...lines,
      'Possible solutions:',
      '  - Reinstall so the prebuilt binary is fetched and checked: `npm install vsnap` (or `npm rebuild vsnap`).',
      '  - Build from source: needs python3, make, g++, the CUDA toolkit headers (cuda.h; set CUDA_PATH if not',
      '    in /usr/local/cuda) and libxxhash-dev; then run `npx node-gyp rebuild` in the package directory.',
      '  - Point VSNAP_NATIVE_PATH at a vsnap.node you built yourself.',
      '  - Prebuilt binaries exist for linux-x64 (glibc >= 2.34, libstdc++ from GCC 9 or newer); other platforms must build from source.',
    ].join('\n'),
    { attempts, root },
  );
}
