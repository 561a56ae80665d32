import { describe, expect, it } from 'vitest';

import { snapshotNameFor, validateName } from '../../src/store/names.js';

describe('snapshot names', () => {
  it.each(['llama-3.1-8b', 'a', 'Model_v2', '0day', 'x'.repeat(128)])('accepts %s', (name) => {
    expect(validateName(name)).toBe(name);
  });

  it.each(['', '.', '..', '../etc', 'a/b', '/abs', '.hidden', '-rf', 'sp ace', 'x'.repeat(129), 'nul\0byte', 'ü'])(
    'rejects %j with E_INVALID_NAME',
    (name) => {
      expect(() => validateName(name)).toThrowError(expect.objectContaining({ code: 'E_INVALID_NAME' }));
    },
  );

  it('says why an over-long name is refused', () => {
    expect(() => validateName('x'.repeat(200))).toThrow(/longer than 128 characters/);
  });

  it('rejects non-strings', () => {
    expect(() => validateName(42)).toThrowError(expect.objectContaining({ code: 'E_INVALID_NAME' }));
  });

  it.each([
    ['meta-llama/Llama-3.1-8B', 'meta-llama--Llama-3.1-8B'],
    ['qwen:7b', 'qwen-7b'],
    ['plain', 'plain'],
  ])('derives a snapshot name from the model name %s', (model, name) => {
    expect(snapshotNameFor(model)).toBe(name);
  });

  it('derives valid, distinct names from model names too long once mapped', () => {
    const a = snapshotNameFor(`${'ab/'.repeat(42)}x`);
    const b = snapshotNameFor(`${'ab/'.repeat(42)}y`);
    expect(validateName(a)).toBe(a);
    expect(validateName(b)).toBe(b);
    expect(a).not.toBe(b);
  });
});
