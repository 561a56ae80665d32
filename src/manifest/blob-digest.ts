import { createHash } from 'node:crypto';

/**
 * A blob's content address: sha256 over the algorithm, size, chunk size and chunk checksums.
 * Identical regions get the same digest and are stored once.
 * @internal
 */
export function blobDigest(size: number, chunkSize: number, checksums: readonly string[]): string {
  const h = createHash('sha256');
  h.update(`vsnap-blob-v1\nxxh3-128\n${size}\n${chunkSize}\n`);
  for (const c of checksums) h.update(`${c}\n`);
  return h.digest('hex');
}
