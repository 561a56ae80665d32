import type { RamTier } from '../cache/ram-tier.js';
import type { GpuTier } from '../cache/gpu-tier.js';
import type { ErrorCode } from '../errors.js';
import { toVsnapError } from '../errors.js';
import { blobProblems } from '../flows/checks.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { RegionStore } from '../store/region-store.js';

/**
 * Errors of a restore that say the snapshot itself is bad (not the engine, not the moment): it is
 * marked damaged, so no engine is suspended for it again until it is re-captured or verified.
 * @internal
 */
export const SNAPSHOT_FAULTS: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'E_CHECKSUM',
  'E_BLOB_TRUNCATED',
  'E_BLOB_MISSING',
  'E_MANIFEST_INVALID',
  'E_MANIFEST_MISMATCH',
  'E_NOT_DURABLE',
  'E_SNAPSHOT_NOT_FOUND',
]);

/** A snapshot known to be unable to restore its engine. @internal */
export interface Damage {
  /** The capture it concerns (a newer capture of the name clears it); undefined: none exists. */
  readonly snapshotId: string | undefined;
  /** Short, without paths: safe to show to clients. */
  readonly reason: string;
}

/** A reason safe for clients: the code and the failing step, never a path. */
export function damageReason(code: ErrorCode, id: string | undefined): string {
  return `its snapshot${id ? ` (capture ${id})` : ''} failed ${code === 'E_SNAPSHOT_NOT_FOUND' ? 'to open' : 'its restore'} with ${code}`;
}

/**
 * Whether the snapshot `name` can bring an engine back, checked before anyone is suspended for it:
 * tier 0 holds its weights; or the current capture is not marked damaged and either its RAM-tier
 * copy is loaded and verified (loaded now, every chunk hashed, when the RAM tier has room) or every
 * blob is in the store with its size. Returns the damage found, or undefined.
 * @internal
 */
export async function checkRestorable(args: {
  store: RegionStore;
  name: string;
  engineKey: string;
  ram: RamTier | undefined;
  resident: GpuTier | undefined;
  known: Damage | undefined;
}): Promise<{ damage?: Damage; detail?: string }> {
  if (args.resident?.peek(args.engineKey)) return {};
  const current = await args.store.current(args.name);
  if (!current) return { damage: { snapshotId: undefined, reason: `the store has no snapshot '${args.name}'` } };
  if (args.known && args.known.snapshotId === current.id) return { damage: args.known };
  if (args.ram?.has(current.id)) return {};
  if (args.ram?.fits(current)) {
    try {
      await args.ram.load(args.store, current, { directIo: false });
      return {};
    } catch (err) {
      const e = toVsnapError(err);
      if (!SNAPSHOT_FAULTS.has(e.code)) throw e;
      return { damage: { snapshotId: current.id, reason: damageReason(e.code, current.id) }, detail: e.message };
    }
  }
  const problems = blobProblems(Snapshot.of(args.store, current));
  if (problems.length) {
    return { damage: { snapshotId: current.id, reason: `its snapshot (capture ${current.id}) has ${problems.length} missing or truncated blob(s)` }, detail: problems.join('; ') };
  }
  return {};
}
