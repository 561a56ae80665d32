import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { detectLibc, type LibcInfo, packageRoot } from '../native/index.js';

/** The libstdc++ this process loaded, and the newest GLIBCXX symbol version it provides. */
export interface LibstdcxxInfo {
  readonly path: string;
  readonly glibcxx: string | undefined;
}

/** What `vsnap doctor` says of the C and C++ runtimes against what the prebuild for this platform needs. */
export interface PlatformCheck {
  /** `linux-x64`, `linux-arm64`, ... */
  readonly target: string;
  readonly libc: LibcInfo;
  readonly libstdcxx: LibstdcxxInfo | undefined;
  /** From prebuilds/REQUIREMENTS.json; undefined where no prebuild is for this target. */
  readonly needs: { readonly glibc: string | null; readonly glibcxx: string | null } | undefined;
  /** Each need this system does not meet, in words; empty when every one is met. */
  readonly unmet: readonly string[];
}

/** `a` against `b` as dotted version numbers: negative, 0 or positive. */
export function compareVersions(a: string, b: string): number {
  const x = a.split('.').map(Number);
  const y = b.split('.').map(Number);
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The libstdc++ mapped into this process (the addon or Node links it), with its newest `GLIBCXX_` version. */
export function detectLibstdcxx(): LibstdcxxInfo | undefined {
  try {
    const shared = (process.report?.getReport() as { sharedObjects?: string[] } | undefined)?.sharedObjects ?? [];
    const path = shared.find((s) => /\/libstdc\+\+\.so/.test(s));
    if (!path) return undefined;
    // the version names are strings in the library's symbol-version table
    const versions = [...readFileSync(path).toString('latin1').matchAll(/GLIBCXX_(\d+(?:\.\d+)+)/g)].map((m) => m[1]!);
    return { path, glibcxx: versions.sort(compareVersions).at(-1) };
  } catch {
    return undefined;
  }
}

/** The runtimes found against the prebuild's needs (prebuilds/REQUIREMENTS.json). */
export function checkPlatform(root: string = packageRoot(), libc: LibcInfo = detectLibc(), libstdcxx: LibstdcxxInfo | undefined = detectLibstdcxx()): PlatformCheck {
  const target = `${process.platform}-${process.arch}`;
  let needs: PlatformCheck['needs'];
  try {
    needs = (JSON.parse(readFileSync(join(root, 'prebuilds', 'REQUIREMENTS.json'), 'utf8')) as Record<string, PlatformCheck['needs']>)[target];
  } catch {
    needs = undefined;
  }
  const unmet: string[] = [];
  if (needs?.glibc) {
    if (libc.family === 'musl') unmet.push(`glibc ${needs.glibc} (this is musl libc)`);
    else if (libc.family === 'glibc' && libc.version && compareVersions(libc.version, needs.glibc) < 0) unmet.push(`glibc ${needs.glibc} (found ${libc.version})`);
  }
  if (needs?.glibcxx && libstdcxx?.glibcxx && compareVersions(libstdcxx.glibcxx, needs.glibcxx) < 0) {
    unmet.push(`GLIBCXX_${needs.glibcxx} (${libstdcxx.path} has GLIBCXX_${libstdcxx.glibcxx})`);
  }
  return { target, libc, libstdcxx, needs, unmet };
}

/** One line for `vsnap doctor`. */
export function describePlatform(p: PlatformCheck): string {
  const libc = p.libc.family === 'glibc' ? `glibc ${p.libc.version ?? '?'}` : p.libc.family === 'musl' ? 'musl libc' : 'C library not identified';
  const cxx = p.libstdcxx ? `libstdc++ GLIBCXX_${p.libstdcxx.glibcxx ?? '?'} (${p.libstdcxx.path})` : 'libstdc++ not loaded';
  if (!p.needs) return `platform: ${p.target}, ${libc}, ${cxx}; no prebuild for ${p.target}: the addon must be built from source (docs/install.md)`;
  const needs = `the prebuild needs glibc ${p.needs.glibc ?? '(any)'} and GLIBCXX_${p.needs.glibcxx ?? '(any)'}`;
  return p.unmet.length === 0
    ? `platform: ${p.target}, ${libc}, ${cxx}; ${needs}: met`
    : `platform: ${p.target}, ${libc}, ${cxx}; ${needs}: NOT MET: ${p.unmet.join(', ')}. Use a newer system (Ubuntu 22.04, Debian 12 or newer) or build the addon from source (docs/install.md)`;
}
