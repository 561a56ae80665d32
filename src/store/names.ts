import { createHash } from 'node:crypto';

import { VsnapError } from '../errors.js';

/** What a snapshot name may be (shared with the config schema). @internal */
export const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

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

/**
 * The default snapshot name of a model name (which may hold `/` and `:`, as in
 * `meta-llama/Llama-3.1-8B`): `/` becomes `--` and `:` becomes `-`, so
 * `meta-llama--Llama-3.1-8B`. A result longer than 128 characters keeps its first 111 and ends
 * in 16 hex digits of its sha256, so distinct long names stay distinct.
 * @internal
 */
export function snapshotNameFor(model: string): string {
  const mapped = model.replaceAll('/', '--').replaceAll(':', '-');
  if (NAME.test(mapped)) return mapped;
  const hash = createHash('sha256').update(model).digest('hex').slice(0, 16);
  const head = mapped.replace(/[^A-Za-z0-9._-]/g, '_').replace(/^[^A-Za-z0-9]+/, '').slice(0, 111);
  return `${head || 'model'}-${hash}`;
}
