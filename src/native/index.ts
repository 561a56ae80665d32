import { loadBinding } from './binding.js';
import type { NativeBinding } from './types.js';

export { detectLibc, diagnose, loadBinding, packageRoot } from './binding.js';
export type { LibcInfo, LoadAttempt } from './binding.js';
export type * from './types.js';

let cached: NativeBinding | undefined;

/**
 * The native addon, loaded on first use (throws E_NATIVE_LOAD, listing every attempt).
 * @internal
 */
export function native(): NativeBinding {
  cached ??= loadBinding();
  return cached;
}
