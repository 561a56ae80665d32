import { describe, expect, it } from 'vitest';

import { parseConfig } from '../../src/serve/config.js';

const config = (tier: string, gpus = '"0": { budgetGiB: 130 }\n  "1": { budgetGiB: 130 }') => `
store: /var/lib/vsnap
gpus:
  ${gpus}
${tier}
models:
  llama:
    url: http://127.0.0.1:8001
    memoryGiB: 40
  qwen:
    url: http://127.0.0.1:8002
    memoryGiB: 20
    gpus: [0]
`;

describe('vsnap serve configuration: neighbourTier', () => {
  it('is optional, and read as a GPU and a budget', () => {
    expect(parseConfig(config(''), 'c.yaml').neighbourTier).toBeUndefined();
    expect(parseConfig(config('neighbourTier: { gpu: 1, budgetGiB: 60 }'), 'c.yaml').neighbourTier).toEqual({ gpu: 1, budgetGiB: 60 });
    // a GPU with no budget (no model there) is bounded by the tier's budget alone
    expect(parseConfig(config('neighbourTier: { gpu: 1, budgetGiB: 60 }', '"0": { budgetGiB: 130 }'), 'c.yaml').neighbourTier?.gpu).toBe(1);
  });

  it('refuses a budget over the GPU\'s, a GPU no model could park on, and unknown keys, with their lines', () => {
    expect(() => parseConfig(config('neighbourTier: { gpu: 1, budgetGiB: 200 }'), 'c.yaml')).toThrow(/c\.yaml:6:\d+ neighbourTier\.budgetGiB: 200 GiB is more than gpu 1's budget of 130 GiB/);
    expect(() => parseConfig(config('neighbourTier: { gpu: 0, budgetGiB: 20 }'), 'c.yaml')).toThrow(/neighbourTier\.gpu: no model could park there/);
    expect(() => parseConfig(config('neighbourTier: { gpu: 1, budgetGiB: 20, device: 1 }'), 'c.yaml')).toThrow(/E_CONFIG|Unrecognized key/);
    expect(() => parseConfig(config('neighbourTier: { gpu: -1, budgetGiB: 20 }'), 'c.yaml')).toThrow(/neighbourTier\.gpu/);
  });
});

describe('vsnap serve configuration: multipath', () => {
  it('takes the neighbour GPU, needs the RAM tier, and a model it can help', () => {
    expect(parseConfig(config('ramTierGiB: 64\nmultipath: { gpu: 1 }'), 'c.yaml').multipath).toEqual({ gpu: 1 });
    expect(() => parseConfig(config('multipath: { gpu: 1 }'), 'c.yaml')).toThrow(/multipath: a restore over two links copies from the RAM tier: set ramTierGiB/);
    expect(() => parseConfig(config('ramTierGiB: 64\nmultipath: { gpu: 0 }'), 'c.yaml')).toThrow(/multipath\.gpu: no model could use it/);
    expect(() => parseConfig(config('ramTierGiB: 64\nmultipath: { gpu: 1, ring: 4 }'), 'c.yaml')).toThrow(/E_CONFIG|Unrecognized key/);
  });
});
