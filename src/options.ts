import { VsnapError } from './errors.js';

/*
 * Options bags reject keys they do not know, as the serve configuration does: a misspelt option
 * (`overlapKVWake`) would otherwise be ignored in silence.
 */

/** Edit distance, for the "did you mean" hint (small strings only). */
function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let previous = row[0]!;
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const next = Math.min(row[j]! + 1, row[j - 1]! + 1, previous + (a[i - 1]!.toLowerCase() === b[j - 1]!.toLowerCase() ? 0 : 1));
      previous = row[j]!;
      row[j] = next;
    }
  }
  return row[b.length]!;
}

/** The known key nearest to `key`, when it is near enough to be a typo. */
export function nearest(key: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const k of known) {
    const d = distance(key, k);
    if (d < bestDistance) [best, bestDistance] = [k, d];
  }
  return best !== undefined && bestDistance <= Math.max(2, Math.floor(key.length / 3)) ? best : undefined;
}

/**
 * Throws E_INVALID_ARGUMENT when `options` has a key not in `known`, with the known key it is
 * likely a typo of. `what` names the bag in the message (`restoreEngine options`).
 * @internal
 */
export function checkOptions(what: string, options: object | undefined, known: readonly string[]): void {
  if (options === undefined) return;
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new VsnapError('E_INVALID_ARGUMENT', `${what} must be an object, got ${options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options}`, { name: what });
  }
  for (const key of Object.keys(options)) {
    if (known.includes(key) || (options as Record<string, unknown>)[key] === undefined) continue;
    const hint = nearest(key, known) ? `: did you mean '${nearest(key, known)}'?` : `; the options are ${known.join(', ')}`;
    throw new VsnapError('E_INVALID_ARGUMENT', `${what} has no option '${key}'${hint}`, { name: what, key, known: [...known] });
  }
}
