import { invalidArgument, VsnapError } from '../errors.js';
import { cudaStatus, listDevices, type GpuDevice } from '../gpu/cuda.js';
import { Manifest } from '../manifest/manifest.js';
import type { ManifestData, PlatformInfo, RankInfo, RegionCodec, RegionInfo } from '../manifest/types.js';
import { blobDigest } from '../manifest/blob-digest.js';
import { VERSION } from '../version.js';
import type { CaptureOptions, CaptureRegion } from './snapshot-types.js';
import { regionId } from '../manifest/region-id.js';

// What a capture records besides the bytes: its regions checked, the platform it ran on, and
// the manifest that binds them.

/** @internal */
export function checkCaptureRegions(regions: readonly CaptureRegion[]): void {
  if (!Array.isArray(regions) || regions.length === 0) invalidArgument('regions', 'a non-empty array', regions);
  const seen = new Set<string>();
  for (const [i, r] of regions.entries()) {
    if (typeof r?.key !== 'string' || r.key.length === 0) invalidArgument(`regions[${i}].key`, 'a non-empty string', r?.key);
    if (!Number.isSafeInteger(r.size) || r.size < 0) invalidArgument(`regions[${i}].size`, 'a non-negative integer', r.size);
    const rank = r.rank ?? 0;
    if (!Number.isInteger(rank) || rank < 0) invalidArgument(`regions[${i}].rank`, 'an integer >= 0', r.rank);
    const id = regionId(rank, r.key);
    if (seen.has(id)) invalidArgument(`regions[${i}].key`, `unique within rank ${rank}`, r.key);
    seen.add(id);
  }
}

function regionDevice(r: CaptureRegion): number | undefined {
  if (r.memory.kind === 'device') return r.memory.allocation.device;
  if (r.memory.kind === 'imported' || (r.memory.kind === 'mapped' && r.memory.source === 'imported')) return r.device ?? r.memory.device ?? 0;
  return undefined;
}

/** The platform record, and the GPUs this process sees (none for host memory). @internal */
export async function platformOf(regions: readonly CaptureRegion[]): Promise<{ platform: PlatformInfo; gpus: GpuDevice[] }> {
  const device = regions.map(regionDevice).find((d) => d !== undefined);
  if (device === undefined) {
    return { platform: { kind: 'host', gpuName: null, computeCapability: null, driverCudaVersion: null, vmmGranularity: null }, gpus: [] };
  }
  const status = await cudaStatus();
  if (!status.available) throw new VsnapError('E_CUDA_UNAVAILABLE', `CUDA is unavailable: ${status.reason}`, { reason: status.reason });
  const gpus = await listDevices();
  const info = gpus.find((d) => d.ordinal === device);
  if (!info) invalidArgument('device', 'a visible CUDA device ordinal', device);
  return {
    platform: {
      kind: 'cuda',
      gpuName: info.name,
      computeCapability: info.computeCapability,
      driverCudaVersion: status.driverVersion,
      vmmGranularity: info.vmmGranularity,
    },
    gpus,
  };
}

/** The manifest of a capture whose transfer produced `checksums` (per region, in `regions` order). @internal */
export function captureManifest(c: {
  id: string;
  name: string;
  regions: readonly CaptureRegion[];
  chunkSize: number;
  checksums: readonly string[][];
  digests: readonly string[];
  /** Per region, its chunks' GPU digests (null when they could not be taken). */
  gpuDigests: ReadonlyArray<readonly string[] | null>;
  /** Per region, the codec of a blob shared with a base capture that is stored coded. */
  codecs?: ReadonlyArray<RegionCodec | undefined>;
  platform: PlatformInfo;
  gpus: readonly GpuDevice[];
  options: CaptureOptions;
  /** hash 'deferred': no checksums yet (`checksums` and `digests` are ignored); see Manifest.awaitingChecksums. */
  deferred?: boolean;
}): Manifest {
  const rankCount = Math.max(...c.regions.map((r) => r.rank ?? 0)) + 1;
  const ranks: RankInfo[] = [];
  for (let rank = 0; rank < rankCount; rank++) {
    const mine = c.regions.map((r, i) => ({ r, i })).filter(({ r }) => (r.rank ?? 0) === rank);
    const dev = mine.map(({ r }) => regionDevice(r)).find((d) => d !== undefined);
    const info = c.gpus.find((d) => d.ordinal === dev);
    ranks.push({
      rank,
      device: info ? { uuid: info.uuid, name: info.name } : null,
      regions: mine.map(({ r, i }): RegionInfo => ({
        key: r.key,
        tag: r.tag ?? 'weights',
        size: r.size,
        chunkSize: c.chunkSize,
        checksums: c.deferred ? [] : c.checksums[i]!,
        blob: c.deferred ? '' : c.digests[i]!,
        tensors: [...(r.tensors ?? [])],
        digests: c.gpuDigests[i] ? [...c.gpuDigests[i]!] : null,
        ...(c.codecs?.[i] ? { codec: c.codecs[i] } : {}),
      })),
    });
  }
  const data = {
    schemaVersion: 2,
    id: c.id,
    name: c.name,
    createdAt: new Date().toISOString(),
    vsnapVersion: VERSION,
    checksumAlgorithm: 'xxh3-128',
    digestAlgorithm: c.gpuDigests.every((d) => d) ? 'vsnap-gd1' : null,
    engine: c.options.engine ?? null,
    model: c.options.model ?? null,
    platform: c.platform,
    ranks,
    expectedResponse: c.options.expectedResponse ?? null,
    labels: { ...(c.options.labels ?? {}) },
  };
  return c.deferred ? Manifest.awaitingChecksums(data as ManifestData, `manifest of '${c.name}'`) : Manifest.parse(data, `manifest of '${c.name}'`);
}

/**
 * The manifest of a capture whose checksums were deferred, now that persisting computed them
 * (per region, in manifest order): validated in full, as one read from a store is. @internal
 */
export function withChecksums(pending: Manifest, checksums: ReadonlyArray<readonly string[]>): Manifest {
  let i = 0;
  return Manifest.parse(
    {
      ...pending.data,
      ranks: pending.data.ranks.map((rank) => ({
        ...rank,
        regions: rank.regions.map((r) => {
          const sums = [...(checksums[i++] ?? [])];
          return { ...r, checksums: sums, blob: blobDigest(r.size, r.chunkSize, sums) };
        }),
      })),
    },
    `manifest of '${pending.name}'`,
  );
}
