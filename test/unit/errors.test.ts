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

  it('maps a write past the file-size limit (EFBIG, from Node or the native addon) to E_NO_SPACE', () => {
    expect(toVsnapError(Object.assign(new Error('too big'), { code: 'EFBIG' })).code).toBe('E_NO_SPACE');
    const native = Object.assign(new Error("pwrite '/s/b': File too large"), { code: 'E_IO', details: { errno: 27, syscall: 'pwrite' } });
    expect(toVsnapError(native)).toMatchObject({ code: 'E_NO_SPACE', details: { errno: 27 } });
    expect(toVsnapError(Object.assign(new Error('eio'), { code: 'E_IO', details: { errno: 5 } })).code).toBe('E_IO');
  });

  it('instanceof VsnapError holds by brand, not by class identity (another build of vsnap), and for nothing else', () => {
    const brand = Symbol.for('vsnap.VsnapError');
    const foreign = Object.defineProperty(new Error('from the other build'), brand, { value: true });
    expect(foreign instanceof VsnapError).toBe(true);
    expect(new Error('plain') instanceof VsnapError).toBe(false);
    expect(Object.assign(new Error('look-alike'), { code: 'E_IO', name: 'VsnapError' }) instanceof VsnapError).toBe(false);
    expect((null as unknown as object) instanceof VsnapError).toBe(false);
    const own = new VsnapError('E_IO', 'x');
    expect(own instanceof VsnapError && own instanceof Error).toBe(true);
    expect(Object.keys(own)).not.toContain(String(brand));
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
