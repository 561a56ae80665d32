import { describe, expect, it } from 'vitest';

import { firstRegions, type FillRegion } from '../../src/flows/fill.js';

const MiB = 1024 * 1024;
const region = (key: string, mib: number, tensors: number): FillRegion => ({ rank: 0, key, tag: 'weights', size: mib * MiB, tensors, device: undefined });

describe('firstRegions: the regions a filled restore makes and copies before the rest', () => {
  it('takes the largest regions holding a tensor of the model, until they hold 12% of the bytes', () => {
    const wanted = [region('a', 100, 2), ...Array.from({ length: 9 }, (_, i) => region(`l${i}`, 100, 7))];
    expect([...firstRegions(wanted)]).toEqual(['0/a', '0/l0']); // 200 of 1000 MiB: the first past 12%
  });

  it('leaves out regions with no tensor of the model (the engine\'s wake may write them: copied after it), however large', () => {
    const wanted = [region('anon:0', 250, 0), region('anon:1', 250, 0), region('embed', 200, 1), ...Array.from({ length: 10 }, (_, i) => region(`l${i}`, 96, 7))];
    const first = firstRegions(wanted);
    expect(first.has('0/anon:0')).toBe(false);
    expect(first.has('0/anon:1')).toBe(false);
    expect([...first]).toEqual(['0/embed']); // 200 of 1660 MiB
  });

  it('takes the largest of all when no region describes its tensors, and nothing of an empty list', () => {
    expect([...firstRegions([region('x', 10, 0), region('y', 90, 0)])]).toEqual(['0/y']);
    expect(firstRegions([]).size).toBe(0);
  });
});
