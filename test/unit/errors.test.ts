import { describe, expect, it } from 'vitest';

import { invalidArgument, toVsnapError, VsnapError } from '../../src/errors.js';

describe('errors', () => {
  it('keeps code and details of native errors', () => {
    const native = Object.assign(new Error('checksum mismatch'), { code: 'E_CHECKSUM', details: { chunk: 3 } });
    const e = toVsnapError(native);
    expect(e).toBeInstanceOf(VsnapError);
    expect(e.code).toBe('E_CHECKSUM');
    expect(e.details).toEqual({ chunk: 3 });
    expect(e.cause).toBe(native);
  });

  it('maps Node errno errors', () => {
    expect(toVsnapError(Object.assign(new Error('no space'), { code: 'ENOSPC' })).code).toBe('E_NO_SPACE');
    const io = toVsnapError(Object.assign(new Error('denied'), { code: 'EACCES', path: '/x' }));
    expect(io.code).toBe('E_IO');
    expect(io.details.path).toBe('/x');
  });

  it('passes VsnapErrors through and wraps everything else as E_INTERNAL', () => {
    const v = new VsnapError('E_TIMEOUT', 'late');
    expect(toVsnapError(v)).toBe(v);
    expect(toVsnapError('weird').code).toBe('E_INTERNAL');
  });

  it('names the parameter, what was expected and what came', () => {
    expect(() => invalidArgument('size', 'a positive integer', -3)).toThrow('size must be a positive integer, got -3');
  });
});
