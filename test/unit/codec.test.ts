// The vsnap-c1 chunk codec on the CPU (native/codec, docs/compression.md): round trips of every
// kind of chunk, property-based; the raw fallback; the format's fixed bytes; damaged chunks
// caught at decode and reported naming the chunk, whatever the damage.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';

import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { codecKindForDtype, decodeChunk, decodeChunkOffThread, encodeChunk, encodeChunkOffThread, inspectChunk, rawModeChunk, type CodecKind } from '../../src/transfer/codec.js';
import { corpus, elementBytes, randomChunk, rng, weights } from '../helpers/codec-data.js';

const KINDS: CodecKind[] = ['bytes', 'bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2'];
const HEADER = 64;
const ref = { chunk: 3, region: 'model.layers.0.weight', snapshot: 'snap-1' };

function roundTrip(bytes: Uint8Array, hint: CodecKind): Buffer {
  const coded = encodeChunk(bytes, hint);
  expect(coded.length).toBeLessThanOrEqual(bytes.length + HEADER);
  const back = decodeChunk(coded, bytes.length, ref);
  expect(Buffer.compare(back, Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length))).toBe(0);
  return coded;
}

describe('vsnap-c1 on the CPU: round trips', () => {
  it.each(corpus(256 * 1024 + 6).map((c) => [c.name, c] as const))('%s (256 KiB + 6 bytes)', (_name, c) => {
    roundTrip(c.bytes, c.hint);
  });

  it('round-trips every kind of chunk under every hint, at odd sizes and unaligned tails', () => {
    const sizes = [0, 1, 2, 3, 4, 5, 15, 16, 17, 4095, 4096, 4097, 8191, 8192 + 3, 3 * 4096 * 4 + 1, 65_537];
    for (const c of corpus(70_001)) {
      for (const size of sizes) {
        for (const hint of KINDS) roundTrip(c.bytes.subarray(0, size), hint);
      }
    }
  });

  it('shrinks Gaussian weights as the design says, and stores what does not shrink raw', () => {
    const size = 4 * 1024 * 1024;
    const ratio = (bytes: Buffer, hint: CodecKind) => roundTrip(bytes, hint).length / bytes.length;
    expect(ratio(weights('bf16', 'gaussian', size), 'bf16')).toBeLessThan(0.72);
    expect(ratio(weights('fp16', 'gaussian', size), 'fp16')).toBeLessThan(0.92);
    expect(ratio(weights('fp32', 'gaussian', size), 'fp32')).toBeLessThan(0.88);
    expect(ratio(weights('fp8-e4m3', 'gaussian', size), 'fp8-e4m3')).toBeLessThan(0.95);
    expect(ratio(weights('fp8-e5m2', 'gaussian', size), 'fp8-e5m2')).toBeLessThan(0.95);
    // zeros: one symbol, no codes at all
    expect(roundTrip(Buffer.alloc(size), 'bytes').length).toBeLessThan(HEADER + 64 + 4 * (size / 4096));
    // random bytes do not shrink: raw, exactly the header more
    const random = randomChunk(size, 11);
    const coded = roundTrip(random, 'bf16');
    expect(coded.length).toBe(size + HEADER);
    expect(inspectChunk(coded, size, ref)).toMatchObject({ mode: 'raw', rawSize: size, codedSize: size + HEADER });
  });

  it('codes a chunk as bytes when that beats the hint (zeros hinted bf16), and records the kind it used', () => {
    const info = inspectChunk(encodeChunk(Buffer.alloc(1 << 20), 'bf16'), 1 << 20, ref);
    expect(info).toMatchObject({ mode: 'planes', kind: 'bytes', width: 0, exceptionCount: 0 });
    const w = weights('bf16', 'gaussian', 1 << 20);
    expect(inspectChunk(encodeChunk(w, 'bf16'), w.length, ref)).toMatchObject({ mode: 'planes', kind: 'bf16', width: 3 });
  });

  it('property: any bytes round-trip under any hint (few distinct values, runs, and noise)', () => {
    const chunk = fc.oneof(
      fc.uint8Array({ maxLength: 20_000 }),
      fc.tuple(fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 9 }), fc.integer({ min: 0, max: 30_000 }), fc.integer()).map(([alphabet, n, seed]) => {
        const r = rng(seed);
        return Uint8Array.from({ length: n }, () => alphabet[Math.floor(r() * alphabet.length)]!);
      }),
      fc.tuple(fc.constantFrom('bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2' as const), fc.constantFrom('gaussian', 'heavy' as const), fc.integer({ min: 0, max: 40_000 }), fc.integer()).map(
        ([kind, draw, n, seed]) => weights(kind, draw, n, seed),
      ),
    );
    fc.assert(
      fc.property(chunk, fc.constantFrom(...KINDS), (bytes, hint) => {
        roundTrip(bytes, hint);
      }),
      { numRuns: 300 },
    );
  });

  it('codes the same bytes the same way every time (deterministic: the GPU encoder must match it byte for byte)', () => {
    const w = weights('bf16', 'heavy', 100_003, 5);
    expect(encodeChunk(w, 'bf16').equals(encodeChunk(Buffer.from(w), 'bf16'))).toBe(true);
  });

  it('fixed vectors: the byte format does not drift (docs/compression.md)', () => {
    // Four bf16 elements 1.0, -2.0, 0.5, 1.0 and a tail byte 0xAB: exponents 127, 128, 126, 127.
    const small = Buffer.from([0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f, 0x80, 0x3f, 0xab]);
    const coded = encodeChunk(small, 'bf16');
    // too small to shrink: raw behind the header
    expect(coded.subarray(0, 24).toString('hex')).toBe('5653433101000000' + '0900000000000000' + '4900000000000000');
    const w = weights('bf16', 'gaussian', 1 << 16, 9);
    const c = encodeChunk(w, 'bf16');
    expect(c.subarray(0, 40).toString('hex')).toMatchInlineSnapshot(`"5653433101010203000001000000000055b30000000000000010000008000000e502000000000000"`);
    expect(createHash('sha256').update(c).digest('hex')).toMatchInlineSnapshot(`"74e84e2169c17ada4374e15643efcfe585b67d33223c845e079b723575defd33"`);
  });

  it('maps engine dtypes to codec kinds', () => {
    expect(codecKindForDtype('torch.bfloat16')).toBe('bf16');
    expect(codecKindForDtype('float16')).toBe('fp16');
    expect(codecKindForDtype('torch.float32')).toBe('fp32');
    expect(codecKindForDtype('torch.float8_e4m3fn')).toBe('fp8-e4m3');
    expect(codecKindForDtype('torch.float8_e5m2')).toBe('fp8-e5m2');
    expect(codecKindForDtype('torch.uint8')).toBe('bytes');
    expect(codecKindForDtype(undefined)).toBe('bytes');
    expect(elementBytes('fp32')).toBe(4);
  });

  it('the embedded kernels (codec_kernel.inc) were generated from the current kernel sources', () => {
    expect(execFileSync('node', ['native/gen-kernel.mjs', 'codec', '--check'], { encoding: 'utf8' })).toMatch(/matches its sources/);
  });
});

function expectCorrupt(fn: () => unknown): VsnapError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(VsnapError);
    const e = err as VsnapError;
    expect(e.code).toBe('E_CODEC_CORRUPT');
    expect(e.message).toContain('chunk 3 of region model.layers.0.weight in snapshot snap-1 is damaged');
    expect(e.details).toMatchObject({ chunk: 3, region: 'model.layers.0.weight', snapshot: 'snap-1' });
    return e;
  }
  throw new Error('a damaged chunk was decoded without an error');
}

describe('vsnap-c1 on the CPU: damaged chunks', () => {
  const raw = weights('bf16', 'heavy', 3 * 4096 * 2 + 1001, 21);
  const coded = encodeChunk(raw, 'bf16');
  const put32 = (b: Buffer, at: number, v: number) => {
    const c = Buffer.from(b);
    c.writeUInt32LE(v, at);
    return c;
  };

  it('refuses a wrong magic, version, mode, kind, width, raw size, coded size, reserved byte or truncation, naming the chunk', () => {
    expect(inspectChunk(coded, raw.length, ref).mode).toBe('planes');
    const cases: Array<[string, Buffer, number?]> = [
      ['magic', put32(coded, 0, 0x31435357)],
      ['version', Buffer.concat([coded.subarray(0, 4), Buffer.from([2]), coded.subarray(5)])],
      ['mode', Buffer.concat([coded.subarray(0, 5), Buffer.from([7]), coded.subarray(6)])],
      ['kind', Buffer.concat([coded.subarray(0, 6), Buffer.from([9]), coded.subarray(7)])],
      ['width', Buffer.concat([coded.subarray(0, 7), Buffer.from([9]), coded.subarray(8)])],
      ['reserved', Buffer.concat([coded.subarray(0, 40), Buffer.from([1]), coded.subarray(41)])],
      ['truncated', coded.subarray(0, coded.length - 1)],
      ['extended', Buffer.concat([coded, Buffer.alloc(1)])],
      ['header only', coded.subarray(0, 30)],
      ['block count', put32(coded, 28, 99)],
      ['exception count', put32(coded, 32, coded.readUInt32LE(32) + 1)],
      ['expected raw size', coded, raw.length - 1],
    ];
    for (const [name, bad, size] of cases) {
      const e = expectCorrupt(() => decodeChunk(bad, size ?? raw.length, ref));
      expect(e.details.reason, name).toBeTypeOf('string');
    }
  });

  it('refuses a block table out of order or out of range, and a block whose escapes disagree with it', () => {
    const h = inspectChunk(coded, raw.length, ref);
    expect(h.exceptionCount).toBeGreaterThan(0);
    // the block table sits after the header and the table (16-aligned): 64 + 16 for width 3
    const blockOff = 64 + 16;
    expectCorrupt(() => decodeChunk(put32(coded, blockOff, 1), raw.length, ref));
    expectCorrupt(() => decodeChunk(put32(coded, blockOff + 4, h.exceptionCount + 1), raw.length, ref));
    expectCorrupt(() => decodeChunk(put32(coded, blockOff + 8, 0), raw.length, ref));
    // a code flipped to or from the escape: its block's escapes no longer match the table
    const codesAt = 64 + 16 + 16;
    let caught = 0;
    for (let i = 0; i < 64; i++) {
      const bad = Buffer.from(coded);
      bad[codesAt + i] = bad[codesAt + i]! ^ 0xff;
      try {
        decodeChunk(bad, raw.length, ref);
      } catch (err) {
        expect((err as VsnapError).code).toBe('E_CODEC_CORRUPT');
        caught++;
      }
    }
    expect(caught).toBeGreaterThan(0);
  });

  it('property: whatever bytes are damaged, a decode returns rawSize bytes or throws E_CODEC_CORRUPT naming the chunk (never reads or writes outside its buffers)', () => {
    const chunks = [coded, encodeChunk(weights('fp32', 'gaussian', 50_001, 4), 'fp32'), encodeChunk(Buffer.alloc(40_000, 7), 'bytes'), encodeChunk(weights('fp8-e5m2', 'heavy', 30_000, 4), 'fp8-e5m2')];
    const sizes = [raw.length, 50_001, 40_000, 30_000];
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: chunks.length - 1 }),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 255 })), { minLength: 1, maxLength: 8 }),
        fc.integer({ min: -3, max: 3 }),
        (which, flips, lengthChange) => {
          const bad = Buffer.from(chunks[which]!);
          for (const [at, x] of flips) bad[at % bad.length] = bad[at % bad.length]! ^ x;
          const damaged = lengthChange < 0 ? bad.subarray(0, bad.length + lengthChange) : Buffer.concat([bad, Buffer.alloc(lengthChange)]);
          try {
            expect(decodeChunk(damaged, sizes[which]!, ref).length).toBe(sizes[which]);
          } catch (err) {
            expect((err as VsnapError).code).toBe('E_CODEC_CORRUPT');
            expect((err as VsnapError).details.chunk).toBe(3);
          }
        },
      ),
      { numRuns: 2000 },
    );
  });
});

describe('vsnap-c1 off the JS thread (what the flows call)', () => {
  it('codes and decodes the same bytes as the synchronous codec, for every kind of chunk', async () => {
    for (const c of corpus(70_001)) {
      const coded = await encodeChunkOffThread(c.bytes, c.hint);
      expect(coded.equals(encodeChunk(c.bytes, c.hint)), c.name).toBe(true);
      expect((await decodeChunkOffThread(coded, c.bytes.length, ref)).equals(Buffer.from(c.bytes)), c.name).toBe(true);
    }
  });

  it('a damaged chunk rejects with E_CODEC_CORRUPT naming it, whether the header or the body is damaged', async () => {
    const raw = weights('bf16', 'heavy', 3 * 4096 * 2 + 1001, 21);
    const coded = encodeChunk(raw, 'bf16');
    const header = Buffer.from(coded);
    header.writeUInt32LE(0x31435357, 0);
    const body = Buffer.from(coded);
    body.writeUInt32LE(body.readUInt32LE(32) + 1, 32);
    for (const bad of [header, body, coded.subarray(0, coded.length - 1)]) {
      const e = await decodeChunkOffThread(bad, raw.length, ref).then(() => undefined, (err: unknown) => err);
      expect(e).toBeInstanceOf(VsnapError);
      expect((e as VsnapError).code).toBe('E_CODEC_CORRUPT');
      expect((e as VsnapError).message).toContain('chunk 3');
    }
  });
});

describe('rawModeChunk', () => {
  it('writes the bytes the encoder writes for a chunk that does not shrink, and they decode', () => {
    for (const size of [1, 13, 4097, 65536 + 3]) {
      const raw = randomChunk(size, size);
      const chunk = rawModeChunk(raw);
      expect(chunk.equals(encodeChunk(raw, 'bytes'))).toBe(true);
      expect(inspectChunk(chunk, size, { chunk: 0 })).toMatchObject({ mode: 'raw', rawSize: size, codedSize: size + 64 });
      expect(decodeChunk(chunk, size, { chunk: 0 }).equals(raw)).toBe(true);
    }
  });
});
