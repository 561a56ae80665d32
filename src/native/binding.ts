import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { VsnapError } from '../errors.js';
import { nativePath, type Environment } from '../settings.js';
import type { NativeBinding } from './types.js';

/** The ABI the TypeScript side was written against (native/addon.cc's abiVersion). */
export const EXPECTED_ABI = 8;

const requireHere = createRequire(import.meta.url);

/**
 * One place the addon was looked for, and why it was not used.
 * @internal
 */
export interface LoadAttempt {
  source: string;
  path?: string;
  error: string;
  /** The Node error code, when there was one (ERR_DLOPEN_DISABLED, ...). */
  code?: string;
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
 * The C library this process runs on: glibc and its version (from Node's own report), or musl.
 * @internal
 */
export interface LibcInfo {
  family: 'glibc' | 'musl' | 'unknown';
  version?: string;
}

/** @internal */
export function detectLibc(): LibcInfo {
  try {
    const header = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header;
    if (header?.glibcVersionRuntime) return { family: 'glibc', version: header.glibcVersionRuntime };
    const shared = (process.report?.getReport() as { sharedObjects?: string[] } | undefined)?.sharedObjects ?? [];
    if (shared.some((s) => s.includes('musl'))) return { family: 'musl' };
  } catch {
    // no report support: say so below
  }
  return { family: 'unknown' };
}

/** What each committed prebuild needs (written by .ci/check-prebuild.mjs --write). */
type Requirements = Record<string, { glibc: string | null; glibcxx: string | null }>;

function requirements(root: string): Requirements {
  try {
    return JSON.parse(readFileSync(join(root, 'prebuilds', 'REQUIREMENTS.json'), 'utf8')) as Requirements;
  } catch {
    return {};
  }
}

/**
 * The advice for one set of failed attempts: says what failed, what this system has and what
 * the prebuild needs. Never suggests reinstalling: the prebuilds ship inside the package.
 * @internal
 */
export function diagnose(attempts: readonly LoadAttempt[], root: string, libc: LibcInfo = detectLibc(), execArgv: readonly string[] = process.execArgv): string[] {
  const target = `${process.platform}-${process.arch}`;
  const needs = requirements(root)[target];
  const found =
    libc.family === 'glibc' ? `glibc ${libc.version}` : libc.family === 'musl' ? 'musl libc' : 'a C library vsnap could not identify';
  const wanted = needs ? `glibc ${needs.glibc ?? '(any)'} or newer and libstdc++ with GLIBCXX_${needs.glibcxx ?? '3.4'}` : undefined;
  const errors = attempts.map((a) => `${a.error} ${a.code ?? ''}`).join('\n');
  const advice: string[] = [];
  const buildFromSource =
    '  - Build it from source (python3, make, g++, cuda.h from the CUDA toolkit or CUDA_PATH, libxxhash-dev): `npx node-gyp rebuild` in the package directory, or point VSNAP_NATIVE_PATH at a vsnap.node you built.';
  if (/ERR_DLOPEN_DISABLED|loading addons is disabled/i.test(errors) || execArgv.includes('--no-addons')) {
    advice.push('  - Node was started with --no-addons (or NODE_OPTIONS has it): vsnap needs its native addon. Start Node without --no-addons.');
    return advice;
  }
  const glibc = /version `GLIBC_([0-9.]+)' not found/.exec(errors);
  const glibcxx = /version `((?:GLIBCXX|CXXABI)_[0-9.]+)' not found/.exec(errors);
  if (libc.family === 'musl') {
    advice.push(`  - This system uses musl libc (Alpine?); the prebuilt binaries are for glibc (${wanted ?? 'glibc'}). Use a glibc-based image (Debian 12, Ubuntu 22.04 or newer, or vLLM's own image), or build from source.`);
    advice.push(buildFromSource);
  } else if (glibc) {
    advice.push(`  - The prebuild needs GLIBC_${glibc[1]}, and this system has ${found}. Use a system with ${wanted ?? `glibc ${glibc[1]} or newer`} (Ubuntu 22.04, Debian 12 or newer), or build from source here.`);
    advice.push(buildFromSource);
  } else if (glibcxx) {
    advice.push(`  - The libstdc++ loaded here lacks ${glibcxx[1]} (this system has ${found}). The prebuild needs ${wanted ?? 'libstdc++ from GCC 11 or newer'}: install a newer libstdc++6, or make sure an older copy (a conda or CUDA toolkit lib directory in LD_LIBRARY_PATH) is not found first.`);
    advice.push(buildFromSource);
  } else if (!needs) {
    const shipped = Object.keys(requirements(root)).join(', ') || 'none';
    advice.push(`  - There is no prebuilt binary for ${target} (prebuilds ship for: ${shipped}).`);
    advice.push(buildFromSource);
  } else {
    advice.push(`  - The prebuild for ${target} needs ${wanted}; this system has ${found}.`);
    advice.push(buildFromSource);
  }
  return advice;
}

/**
 * Loads the addon, trying in order: `$VSNAP_NATIVE_PATH` (an explicit .node file), then
 * node-gyp-build over the package root (build/Release, build/Debug, then prebuilds/ for this
 * platform). Throws one E_NATIVE_LOAD error listing every attempt and what to do.
 * @internal
 */
export function loadBinding(root: string = packageRoot(), env: Environment = process.env): NativeBinding {
  const attempts: LoadAttempt[] = [];
  const candidates: Array<{ source: string; path: () => string }> = [];
  const explicit = nativePath(env);
  if (explicit) candidates.push({ source: 'VSNAP_NATIVE_PATH', path: () => resolve(explicit) });
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
      const code = (err as { code?: unknown }).code;
      attempts.push({
        source: candidate.source,
        ...(path ? { path } : {}),
        error: describe(err),
        ...(typeof code === 'string' ? { code } : {}),
      });
    }
  }
  const lines = attempts.map((a) => `  - ${a.source}${a.path ? ` (${a.path})` : ''}: ${a.error}`);
  const libc = detectLibc();
  throw new VsnapError(
    'E_NATIVE_LOAD',
    [
      `Could not load the vsnap native addon for ${process.platform}-${process.arch}, Node ${process.versions.node}` +
        ` (${libc.family === 'glibc' ? `glibc ${libc.version}` : libc.family === 'musl' ? 'musl libc' : 'C library unknown'}).`,
      'Tried:',
      ...lines,
      'What to do:',
      ...diagnose(attempts, root, libc),
    ].join('\n'),
    { attempts, root, libc },
  );
}
