import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

// @ts-expect-error: a plain JavaScript module of the repository's scripts
import { check } from '../../scripts/check-layers.mjs';

const source = (path: string) => readFileSync(fileURLToPath(new URL(`../../src/${path}`, import.meta.url)), 'utf8');
const imports = (path: string) => [...source(path).matchAll(/^import [^;]*? from '([^']+)';/gms)].map((m) => m[1]);

describe('layering', () => {
  it('imports only go down the layers of docs/architecture.md, with no circle (scripts/check-layers.mjs)', () => {
    expect((check() as { problems: string[] }).problems).toEqual([]);
  });

  it('engine flows are a layer above Snapshot: snapshot/ knows nothing of engines', () => {
    expect(imports('snapshot/snapshot.ts').filter((m) => /engine|flows/.test(m!))).toEqual([]);
    expect(imports('flows/capture.ts')).toContain('../snapshot/snapshot.js');
  });

  it('the swap planner is pure: it imports nothing', () => {
    expect(imports('swap/planner.ts')).toEqual([]);
  });
});
