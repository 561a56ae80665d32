import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { native } from '../native/index.js';

/**
 * How the vsnap-c1 codec splits a chunk's elements (docs/compression.md): the exponent field of
 * each element is coded, sign and mantissa are kept; `bytes` codes whole bytes.
 * @public
 */
export type CodecKind = 'bytes' | 'bf16' | 'fp16' | 'fp32' | 'fp8-e4m3' | 'fp8-e5m2';

/** The kinds in the order of their number in the format (native/codec/codec_format.h Kind). */
const KINDS: readonly CodecKind[] = ['bytes', 'bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2'];

/** @internal */
export function codecKindNumber(kind: CodecKind): number {
  const i = KINDS.indexOf(kind);
  if (i < 0) invalidArgument('kind', `one of ${KINDS.join(', ')}`, kind);
  return i + 1;
}

/**
 * The codec kind for a tensor dtype as an engine names it (torch: `torch.bfloat16`, `bfloat16`,
 * `bf16`, ...); `bytes` for anything else (integers, packed 4-bit, unknown).
 * @internal
 */
export function codecKindForDtype(dtype: string | null | undefined): CodecKind {
  const d = (dtype ?? '').toLowerCase().replace(/^torch\./, '');
  if (d === 'bfloat16' || d === 'bf16') return 'bf16';
  if (d === 'float16' || d === 'half' || d === 'fp16') return 'fp16';
  if (d === 'float32' || d === 'float' || d === 'fp32') return 'fp32';
  if (d === 'float8_e4m3fn' || d === 'float8_e4m3fnuz' || d === 'fp8-e4m3' || d === 'e4m3') return 'fp8-e4m3';
  if (d === 'float8_e5m2' || d === 'float8_e5m2fnuz' || d === 'fp8-e5m2' || d === 'e5m2') return 'fp8-e5m2';
  return 'bytes';
}

/**
 * Which chunk a coded chunk is, for error messages (the snapshot and region where known).
 * @public
 */
export interface ChunkRef {
  /** The chunk's index in its region. */
  chunk: number;
  /** The region's key. */
  region?: string;
  /** The snapshot's name. */
  snapshot?: string;
}

/**
 * A coded chunk's header: `raw` (stored as it is, behind the header) or `planes` (coded).
 * @public
 */
export interface CodedChunkInfo {
  /** `raw`: stored as it is, behind the header; `planes`: coded. */
  mode: 'raw' | 'planes';
  /** The element kind the chunk was coded as (`planes` only). */
  kind?: CodecKind;
  /** Bits a coded exponent takes (`planes` only). */
  width: number;
  /** The chunk's decoded size. */
  rawSize: number;
  /** The chunk's coded size, header included. */
  codedSize: number;
  /** Elements whose exponent had no code (stored in the exception list). */
  exceptionCount: number;
}

function where(ref: ChunkRef): string {
  return `chunk ${ref.chunk}${ref.region === undefined ? '' : ` of region ${ref.region}`}${ref.snapshot === undefined ? '' : ` in snapshot ${ref.snapshot}`}`;
}

/** E_CODEC_CORRUPT with the chunk, region and snapshot in its message and details; any other error as it is. @internal */
export function namedChunkError(err: unknown, ref: ChunkRef): VsnapError {
  const e = toVsnapError(err);
  if (e.code !== 'E_CODEC_CORRUPT') return e;
  const reason = String(e.details.reason ?? e.message);
  return new VsnapError(
    'E_CODEC_CORRUPT',
    `${where(ref)} is damaged: ${reason}. Nothing of it was written; restore from another copy of the snapshot (\`vsnap verify\` finds the damaged ones) or capture again.`,
    { ...ref, reason },
    { cause: e },
  );
}

/**
 * Encodes one chunk on the CPU (vsnap-c1): coded when that makes it smaller, else stored raw
 * behind the 64-byte header.
 * @public
 */
export function encodeChunk(bytes: Uint8Array, hint: CodecKind = 'bytes'): Buffer {
  return native().codecEncode(bytes, codecKindNumber(hint));
}

/**
 * {@link encodeChunk} off the JS thread (the libuv pool): what the SDK's flows call, so a service's
 * event loop never waits out the CPU codec. `bytes` must not change until it settles.
 * @internal
 */
export function encodeChunkOffThread(bytes: Uint8Array, hint: CodecKind = 'bytes'): Promise<Buffer> {
  return native().codecEncodeAsync(bytes, codecKindNumber(hint));
}

/** Bytes of a coded chunk's header (docs/compression.md, the byte format). @internal */
export const CHUNK_HEADER_BYTES = 64;

/**
 * `raw` as a vsnap-c1 chunk stored raw (mode 0): the 64-byte header, then the bytes; what
 * {@link encodeChunk} writes for a chunk that does not shrink.
 * @internal
 */
export function rawModeChunk(raw: Uint8Array): Buffer {
  const out = Buffer.alloc(CHUNK_HEADER_BYTES + raw.length);
  out.writeUInt32LE(0x31435356, 0); // magic VSC1
  out.writeUInt8(1, 4); // version; mode, kind and width stay 0
  out.writeBigUInt64LE(BigInt(raw.length), 8);
  out.writeBigUInt64LE(BigInt(out.length), 16);
  out.set(raw, CHUNK_HEADER_BYTES);
  return out;
}

/**
 * Decodes one coded chunk on the CPU into its `rawSize` bytes. A damaged chunk throws
 * E_CODEC_CORRUPT naming it (`ref`); the decoder never reads or writes outside its buffers.
 * @public
 */
export function decodeChunk(coded: Uint8Array, rawSize: number, ref: ChunkRef): Buffer {
  try {
    return native().codecDecode(coded, rawSize);
  } catch (err) {
    throw namedChunkError(err, ref);
  }
}

/**
 * {@link decodeChunk} off the JS thread (the header checked first on the calling one); `coded`
 * must not change until it settles.
 * @internal
 */
export async function decodeChunkOffThread(coded: Uint8Array, rawSize: number, ref: ChunkRef): Promise<Buffer> {
  try {
    return await native().codecDecodeAsync(coded, rawSize);
  } catch (err) {
    throw namedChunkError(err, ref);
  }
}

/**
 * A coded chunk's header, checked as a decode checks it (E_CODEC_CORRUPT naming the chunk).
 * @public
 */
export function inspectChunk(coded: Uint8Array, rawSize: number, ref: ChunkRef): CodedChunkInfo {
  try {
    const h = native().codecParse(coded, rawSize);
    return {
      mode: h.mode === 0 ? 'raw' : 'planes',
      ...(h.mode === 0 ? {} : { kind: KINDS[h.kind - 1] }),
      width: h.width,
      rawSize: h.rawSize,
      codedSize: h.codedSize,
      exceptionCount: h.exceptionCount,
    };
  } catch (err) {
    throw namedChunkError(err, ref);
  }
}

/**
 * Decodes one coded chunk on GPU `device`: host bytes in and out through the device, with the
 * kernel's own time (`kernelMs`). The header is checked on the host before any byte reaches the device.
 * @public
 */
export async function decodeChunkOnDevice(coded: Uint8Array, rawSize: number, device: number, ref: ChunkRef): Promise<{ data: Buffer; kernelMs: number }> {
  try {
    return await native().codecDecodeDevice(coded, rawSize, device);
  } catch (err) {
    throw namedChunkError(err, ref);
  }
}

/**
 * Encodes one chunk on GPU `device`, with the kernel's own time (`kernelMs`); the same bytes as
 * {@link encodeChunk}.
 * @public
 */
export async function encodeChunkOnDevice(bytes: Uint8Array, hint: CodecKind, device: number): Promise<{ coded: Buffer; kernelMs: number }> {
  try {
    return await native().codecEncodeDevice(bytes, codecKindNumber(hint), device);
  } catch (err) {
    throw toVsnapError(err);
  }
}
