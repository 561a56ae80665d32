import { describe, expect, it } from 'vitest';

import { validateName } from '../../src/store/names.js';

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
});
