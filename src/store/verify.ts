import { abortError, toVsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { readBlobChunk } from './coded-blob.js';
import type { StoreFiles } from './files.js';
import type { VerifyProblem, VerifyReport } from './types.js';

/**
 * Re-hashes every blob of `manifest` (the caller holds the shared blob lock) and reports every
 * problem found. A blob path that is a link is a problem of its region (E_STORE_UNSAFE).
 * @internal
 */
export async function verifyManifest(files: Pick<StoreFiles, 'blobPath'>, manifest: Manifest, options: TransferOptions): Promise<VerifyReport> {
  const started = performance.now();
  const problems: VerifyProblem[] = [];
  const regions: Array<{ rank: number; key: string; blobPath: string; size: number; chunkSize: number; checksums: readonly string[] }> = [];
  const coded: Array<{ rank: number; region: RegionInfo; blobPath: string }> = [];
  for (const { rank, region } of manifest.regions()) {
    try {
      const blobPath = files.blobPath(region.blob);
      if (region.codec) coded.push({ rank, region, blobPath });
      else regions.push({ rank, key: region.key, blobPath, size: region.size, chunkSize: region.chunkSize, checksums: region.checksums });
    } catch (err) {
      const e = toVsnapError(err);
      problems.push({ rank, region: region.key, code: e.code, message: e.message });
    }
  }
  const job = (subset: typeof regions, onProgress?: TransferOptions['onProgress']) =>
    runTransfer({
      op: 'verify',
      label: manifest.name,
      regions: subset.map((r) => ({ name: r.key, blobPath: r.blobPath, size: r.size, chunkSize: r.chunkSize, checksums: r.checksums })),
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.threads ? { threads: options.threads } : {}),
      directIo: options.directIo ?? false,
      ...(onProgress ? { onProgress } : {}),
    });
  let damaged = false;
  try {
    // One job over every region keeps all threads busy; it stops at the first problem.
    await job(regions, options.onProgress);
  } catch (err) {
    const e = toVsnapError(err);
    // not damage: a cancel, no addon, a bad argument or a bad setting (never reported as a damaged blob)
    if (e.code === 'E_ABORTED' || e.code === 'E_NATIVE_LOAD' || e.code === 'E_INVALID_ARGUMENT' || e.code === 'E_CONFIG') throw e;
    damaged = true;
  }
  if (damaged) {
    // Something is damaged: go region by region to report every problem, not just the first.
    for (const entry of regions) {
      try {
        await job([entry]);
      } catch (err) {
        const e = toVsnapError(err);
        if (e.code === 'E_ABORTED') throw e;
        problems.push({ rank: entry.rank, region: entry.key, code: e.code, message: e.message });
      }
    }
  }
  // Coded blobs (docs/compression.md): each chunk decoded on the CPU and checked against its checksum.
  for (const { rank, region, blobPath } of coded) {
    try {
      for (let i = 0; i < region.checksums.length; i++) {
        if (options.signal?.aborted) throw abortError(options.signal, `verify of ${manifest.name}`);
        await readBlobChunk(blobPath, region, i, manifest.name);
      }
    } catch (err) {
      const e = toVsnapError(err);
      if (e.code === 'E_ABORTED') throw e;
      problems.push({ rank, region: region.key, code: e.code, message: e.message });
    }
  }
  return {
    name: manifest.name,
    id: manifest.id,
    ok: problems.length === 0,
    bytes: manifest.totalBytes,
    seconds: (performance.now() - started) / 1000,
    problems,
  };
}
