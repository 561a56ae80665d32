import { describe, expect, it } from 'vitest';

import { checkPlatform, compareVersions, describePlatform, detectLibstdcxx } from '../../src/cli/platform.js';

const root = process.cwd(); // prebuilds/REQUIREMENTS.json of this checkout
const needs = (JSON.parse(await import('node:fs').then((fs) => fs.readFileSync('prebuilds/REQUIREMENTS.json', 'utf8'))) as Record<string, { glibc: string; glibcxx: string }>)[`${process.platform}-${process.arch}`]!;
const cxx = (glibcxx: string) => ({ path: '/usr/lib/libstdc++.so.6', glibcxx });

describe('vsnap doctor: glibc and libstdc++ against what the prebuild needs', () => {
  it('compares dotted versions as numbers', () => {
    expect(compareVersions('2.34', '2.4')).toBeGreaterThan(0);
    expect(compareVersions('3.4.29', '3.4.29')).toBe(0);
    expect(compareVersions('3.4.9', '3.4.29')).toBeLessThan(0);
  });

  it('met: says so, with what was found and what is needed', () => {
    const p = checkPlatform(root, { family: 'glibc', version: '2.39' }, cxx('3.4.33'));
    expect(p.unmet).toEqual([]);
    expect(describePlatform(p)).toBe(`platform: ${p.target}, glibc 2.39, libstdc++ GLIBCXX_3.4.33 (/usr/lib/libstdc++.so.6); the prebuild needs glibc ${needs.glibc} and GLIBCXX_${needs.glibcxx}: met`);
  });

  it('an old glibc, an old libstdc++, musl: each named', () => {
    expect(checkPlatform(root, { family: 'glibc', version: '2.31' }, cxx('3.4.33')).unmet).toEqual([`glibc ${needs.glibc} (found 2.31)`]);
    expect(checkPlatform(root, { family: 'glibc', version: '2.39' }, cxx('3.4.28')).unmet).toEqual([`GLIBCXX_${needs.glibcxx} (/usr/lib/libstdc++.so.6 has GLIBCXX_3.4.28)`]);
    const musl = checkPlatform(root, { family: 'musl' }, undefined);
    expect(musl.unmet).toEqual([`glibc ${needs.glibc} (this is musl libc)`]);
    expect(describePlatform(musl)).toMatch(/NOT MET: glibc .* \(this is musl libc\)\. Use a newer system .* or build the addon from source/);
  });

  it('no prebuild for the platform: says the addon must be built', () => {
    expect(describePlatform(checkPlatform('/nonexistent', { family: 'glibc', version: '2.39' }, cxx('3.4.33')))).toMatch(/no prebuild for .*built from source/);
  });

  it('finds the libstdc++ this process loaded and its newest GLIBCXX version', () => {
    const found = detectLibstdcxx();
    expect(found?.path).toMatch(/libstdc\+\+\.so/);
    expect(found?.glibcxx).toMatch(/^3\.4\.\d+$/);
  });
});
