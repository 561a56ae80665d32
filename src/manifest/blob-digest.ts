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

/**
 * A coded blob's content address (docs/compression.md): sha256 over the codec, the raw blob's
 * digest (the decoded content) and each chunk's coded size. Two coded blobs of the same name decode
 * to the same bytes in the same chunk boundaries, so either serves every manifest naming it; a
 * region stored coded and raw gets two names (their bytes differ), each verifiable against the
 * same checksums of the decoded bytes.
 * @internal
 */
export function codedBlobDigest(size: number, chunkSize: number, checksums: readonly string[], codec: string, codedSizes: readonly number[]): string {
  const h = createHash('sha256');
  h.update(`vsnap-coded-blob-v1\n${codec}\n${blobDigest(size, chunkSize, checksums)}\n`);
  for (const c of codedSizes) h.update(`${c}\n`);
  return h.digest('hex');
}
