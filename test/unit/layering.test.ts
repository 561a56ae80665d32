import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

const source = (path: string) => readFileSync(fileURLToPath(new URL(`../../src/${path}`, import.meta.url)), 'utf8');
const imports = (path: string) => [...source(path).matchAll(/^import [^;]*? from '([^']+)';/gms)].map((m) => m[1]);

describe('layering', () => {
  it('engine flows are a layer above Snapshot: snapshot.ts knows nothing of engines', () => {
    expect(imports('snapshot/snapshot.ts').filter((m) => /engine/.test(m!))).toEqual([]);
    expect(imports('snapshot/engine-flows.ts')).toContain('./snapshot.js');
  });

  it('the swap planner is pure: it imports nothing', () => {
    expect(imports('swap/planner.ts')).toEqual([]);
  });
});
