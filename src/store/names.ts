import { VsnapError } from '../errors.js';

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/**
 * Snapshot names become directory names: 1-128 characters of letters, digits, `.`, `_` and `-`,
 * not starting with `.` or `-` (so no `..`, no hidden files, no option look-alikes, no slashes).
 * @internal
 */
export function validateName(name: unknown, what = 'snapshot name'): string {
  if (typeof name !== 'string' || !NAME.test(name)) {
    const shown = typeof name === 'string' ? JSON.stringify(name.length > 140 ? `${name.slice(0, 140)}…` : name) : String(name);
    const hint =
      typeof name === 'string' && name.length > 128
        ? 'it is longer than 128 characters'
        : 'use 1-128 letters, digits, ".", "_" or "-", starting with a letter or digit';
    throw new VsnapError('E_INVALID_NAME', `invalid ${what} ${shown}: ${hint}`, { name });
  }
  return name;
}
