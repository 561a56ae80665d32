// src/regions/host-region.ts
import { closeSync, readSync, writeSync } from "node:fs";

// src/errors.ts
var CODES = {
  E_INVALID_ARGUMENT: true,
  E_INVALID_NAME: true,
  E_NATIVE_LOAD: true,
  E_CUDA_UNAVAILABLE: true,
  E_CUDA: true,
  E_IO: true,
  E_NO_SPACE: true,
  E_CHECKSUM: true,
  E_BLOB_TRUNCATED: true,
  E_BLOB_MISSING: true,
  E_MANIFEST_INVALID: true,
  E_MANIFEST_MISMATCH: true,
  E_SNAPSHOT_NOT_FOUND: true,
  E_NOT_DURABLE: true,
  E_STORE_INVALID: true,
  E_STORE_UNSAFE: true,
  E_STORE_LOCKED: true,
  E_ABORTED: true,
  E_TIMEOUT: true,
  E_CLOSED: true,
  E_OUT_OF_RANGE: true,
  E_IPC_PROTOCOL: true,
  E_IPC_AUTH: true,
  E_ADDRESS_IN_USE: true,
  E_ENGINE_HTTP: true,
  E_ENGINE_UNREACHABLE: true,
  E_ENGINE_PROTOCOL: true,
  E_ENGINE_STATE: true,
  E_NOT_RESTORABLE: true,
  E_RESPONSE_MISMATCH: true,
  E_BUSY: true,
  E_UNKNOWN_MODEL: true,
  E_CONFIG: true,
  E_INTERNAL: true
};
var KNOWN_CODES = new Set(Object.keys(CODES));
var BRAND = /* @__PURE__ */ Symbol.for("vsnap.VsnapError");
var VsnapError = class extends Error {
  /** True for every VsnapError made by any copy of vsnap (the ESM and CommonJS builds alike). */
  static [Symbol.hasInstance](value) {
    return typeof value === "object" && value !== null && value[BRAND] === true;
  }
  /** Stable code; see {@link ErrorCode}. */
  code;
  /** Structured facts about the failure (paths, regions, expected and actual values). */
  details;
  constructor(code, message, details = {}, options) {
    super(message, options);
    this.name = "VsnapError";
    Object.defineProperty(this, BRAND, { value: true });
    this.code = code;
    this.details = details;
  }
};
function toVsnapError(err) {
  if (err instanceof VsnapError) return err;
  if (err instanceof Error) {
    const raw = err.code;
    const details = err.details ?? {};
    if (typeof raw === "string" && KNOWN_CODES.has(raw)) {
      return new VsnapError(raw, err.message, details, { cause: err });
    }
    if (typeof raw === "string" && (raw === "ENOSPC" || raw === "EDQUOT" || raw === "EFBIG")) {
      const limit = raw === "EFBIG" ? " (the process file-size limit, RLIMIT_FSIZE, was reached)" : "";
      return new VsnapError("E_NO_SPACE", `${err.message}${limit}. Free space or choose another store root.`, { errno: raw, path: err.path }, { cause: err });
    }
    if (typeof raw === "string" && raw.startsWith("E")) {
      return new VsnapError("E_IO", err.message, { errno: raw, path: err.path }, { cause: err });
    }
    return new VsnapError("E_INTERNAL", err.message, {}, { cause: err });
  }
  return new VsnapError("E_INTERNAL", String(err));
}
function invalidArgument(name, expected, actual) {
  let shown;
  try {
    shown = typeof actual === "bigint" ? `${actual}n` : JSON.stringify(actual) ?? String(actual);
  } catch {
    shown = String(actual);
  }
  throw new VsnapError("E_INVALID_ARGUMENT", `${name} must be ${expected}, got ${shown}`, { name, expected });
}
function abortError(signal, what) {
  return new VsnapError("E_ABORTED", `${what} was cancelled`, {}, { cause: signal?.reason });
}

// src/native/binding.ts
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
var EXPECTED_ABI = 3;
var requireHere = createRequire(import.meta.url);
function packageRoot(from = dirname(fileURLToPath(import.meta.url))) {
  let dir = from;
  for (; ; ) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest)) {
      try {
        if (JSON.parse(readFileSync(manifest, "utf8")).name === "vsnap") return dir;
      } catch {
      }
    }
    const parent = dirname(dir);
    if (parent === dir) return resolve(from, "..", "..");
    dir = parent;
  }
}
function describe(err) {
  return err instanceof Error ? err.message.split("\n")[0] : String(err);
}
function loadBinding(root = packageRoot(), env = process.env) {
  const attempts = [];
  const candidates = [];
  if (env.VSNAP_NATIVE_PATH) {
    candidates.push({ source: "VSNAP_NATIVE_PATH", path: () => resolve(env.VSNAP_NATIVE_PATH) });
  }
  candidates.push({
    source: "node-gyp-build",
    path: () => requireHere("node-gyp-build").path(root)
  });
  for (const candidate of candidates) {
    let path;
    try {
      path = candidate.path();
      if (!existsSync(path)) throw new Error(`no file at ${path}`);
      const binding = requireHere(path);
      if (binding.abiVersion !== EXPECTED_ABI) {
        throw new Error(`addon ABI ${binding.abiVersion} does not match the JavaScript (${EXPECTED_ABI}): rebuild it`);
      }
      return binding;
    } catch (err) {
      attempts.push({ source: candidate.source, ...path ? { path } : {}, error: describe(err) });
    }
  }
  const lines = attempts.map((a) => `  - ${a.source}${a.path ? ` (${a.path})` : ""}: ${a.error}`);
  throw new VsnapError(
    "E_NATIVE_LOAD",
    [
      `Could not load the vsnap native addon for ${process.platform}-${process.arch}, Node ${process.versions.node}.`,
      "Tried:",
      ...lines,
      "Possible solutions:",
      "  - Reinstall so the prebuilt binary is fetched and checked: `npm install vsnap` (or `npm rebuild vsnap`).",
      "  - Build from source: needs python3, make, g++, the CUDA toolkit headers (cuda.h; set CUDA_PATH if not",
      "    in /usr/local/cuda) and libxxhash-dev; then run `npx node-gyp rebuild` in the package directory.",
      "  - Point VSNAP_NATIVE_PATH at a vsnap.node you built yourself.",
      "  - Prebuilt binaries exist for linux-x64 (glibc >= 2.34, libstdc++ from GCC 9 or newer); other platforms must build from source."
    ].join("\n"),
    { attempts, root }
  );
}

// src/native/index.ts
var cached;
function native() {
  cached ??= loadBinding();
  return cached;
}

// src/regions/host-region.ts
var HostRegion = class _HostRegion {
  /** The memfd; valid until {@link HostRegion.close}. */
  fd;
  /** Size in bytes. */
  size;
  open = true;
  constructor(fd, size) {
    this.fd = fd;
    this.size = size;
  }
  /** Creates a zero-filled region of `size` bytes. */
  static create(size, name = "vsnap-region") {
    if (!Number.isSafeInteger(size) || size < 0) invalidArgument("size", "a non-negative integer byte count", size);
    try {
      return new _HostRegion(native().createMemfd(name, size), size);
    } catch (err) {
      throw toVsnapError(err);
    }
  }
  /** Wraps a descriptor received from another process (this object then owns it). */
  static fromFd(fd) {
    try {
      return new _HostRegion(fd, native().fdSize(fd));
    } catch (err) {
      throw toVsnapError(err);
    }
  }
  /** The region as transfer memory. */
  get memory() {
    this.check(0, 0);
    return { kind: "host", fd: this.fd };
  }
  /** Writes `data` at `offset`. */
  write(offset, data) {
    this.check(offset, data.byteLength);
    let done = 0;
    while (done < data.byteLength) done += writeSync(this.fd, data, done, data.byteLength - done, offset + done);
  }
  /** Reads `length` bytes at `offset`. */
  read(offset, length) {
    this.check(offset, length);
    const out = Buffer.allocUnsafe(length);
    let done = 0;
    while (done < length) {
      const n = readSync(this.fd, out, done, length - done, offset + done);
      if (n === 0) throw new VsnapError("E_IO", `host region ended at byte ${offset + done}`);
      done += n;
    }
    return out;
  }
  /** Frees the memory (once no running transfer still maps it). Idempotent. */
  close() {
    if (!this.open) return;
    this.open = false;
    closeSync(this.fd);
  }
  /** Same as {@link HostRegion.close}, for `using`. */
  [Symbol.dispose]() {
    this.close();
  }
  check(offset, length) {
    if (!this.open) throw new VsnapError("E_CLOSED", "this HostRegion was closed");
    if (!Number.isSafeInteger(offset) || offset < 0 || !Number.isSafeInteger(length) || length < 0 || offset + length > this.size) {
      throw new VsnapError("E_OUT_OF_RANGE", `[${offset}, +${length}) is outside a ${this.size}-byte host region`);
    }
  }
};

// src/store/region-store.ts
import { randomBytes } from "node:crypto";
import { lstatSync as lstatSync3, mkdirSync as mkdirSync3, readdirSync, realpathSync, statfsSync } from "node:fs";
import { readdir, rm as rm2, unlink } from "node:fs/promises";
import { join as join3 } from "node:path";

// src/manifest/compat.ts
function show(v) {
  return v === void 0 ? "nothing" : JSON.stringify(v);
}
function compareFields(section, snapshot, live, out) {
  if (!live) return;
  for (const [field, actual] of Object.entries(live)) {
    if (actual === void 0) continue;
    const expected = snapshot ? snapshot[field] : void 0;
    if (expected !== actual) {
      const path = `${section}.${field}`;
      out.push({ kind: "field", path, expected, actual, message: `${path}: the snapshot has ${show(expected)}, the live engine ${show(actual)}` });
    }
  }
}
function findMismatches(manifest, live) {
  const out = [];
  compareFields("engine", manifest.engine, live.engine, out);
  compareFields("model", manifest.model, live.model, out);
  compareFields("platform", manifest.platform, live.platform, out);
  if (manifest.ranks.length !== live.ranks.length) {
    out.push({
      kind: "rank-count",
      path: "ranks",
      expected: manifest.ranks.length,
      actual: live.ranks.length,
      message: `the snapshot has ${manifest.ranks.length} rank(s), the live engine ${live.ranks.length}`
    });
  }
  const rankCount = Math.min(manifest.ranks.length, live.ranks.length);
  for (let r = 0; r < rankCount; r++) {
    const captured = new Map(manifest.ranks[r].regions.map((x) => [x.key, x]));
    const seen = /* @__PURE__ */ new Set();
    for (const region of live.ranks[r].regions) {
      const path = `ranks[${r}].regions[${JSON.stringify(region.key)}]`;
      if (seen.has(region.key)) {
        out.push({ kind: "region-duplicate", path, expected: 1, actual: 2, message: `${path}: the live layout lists this key twice` });
        continue;
      }
      seen.add(region.key);
      const want = captured.get(region.key);
      if (!want) {
        out.push({ kind: "region-unexpected", path, expected: void 0, actual: region.size, message: `${path}: live, but not in the snapshot` });
        continue;
      }
      if (want.size !== region.size) {
        out.push({
          kind: "region-size",
          path: `${path}.size`,
          expected: want.size,
          actual: region.size,
          message: `${path}: ${want.size} bytes in the snapshot, ${region.size} live`
        });
      }
      if (region.tag !== void 0 && region.tag !== want.tag) {
        out.push({
          kind: "region-tag",
          path: `${path}.tag`,
          expected: want.tag,
          actual: region.tag,
          message: `${path}: tagged ${show(want.tag)} in the snapshot, ${show(region.tag)} live`
        });
      }
    }
    for (const key of captured.keys()) {
      if (!seen.has(key)) {
        const path = `ranks[${r}].regions[${JSON.stringify(key)}]`;
        out.push({ kind: "region-missing", path, expected: captured.get(key).size, actual: void 0, message: `${path}: in the snapshot, missing live` });
      }
    }
  }
  return out;
}

// src/manifest/schema.ts
import { z } from "zod";

// src/store/digest.ts
import { createHash } from "node:crypto";
function blobDigest(size, chunkSize, checksums) {
  const h = createHash("sha256");
  h.update(`vsnap-blob-v1
xxh3-128
${size}
${chunkSize}
`);
  for (const c of checksums) h.update(`${c}
`);
  return h.digest("hex");
}

// src/manifest/schema.ts
var byteCount = z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER);
var checksum = z.string().regex(/^[0-9a-f]{32}$/, "a 32-digit lowercase hex xxh3-128 checksum");
var digest = z.string().regex(/^[0-9a-f]{64}$/, "a 64-digit lowercase hex sha256 digest");
var TensorSchema = z.object({
  name: z.string().min(1),
  offset: byteCount,
  dtype: z.string().min(1),
  shape: z.array(z.number().int().nonnegative())
});
var RegionSchema = z.object({
  /** Order-independent identity: the lowest-offset named tensor inside, else `anon:N`. */
  key: z.string().min(1).max(1024),
  /** The allocator tag, e.g. `weights`. */
  tag: z.string().min(1).max(64),
  size: byteCount,
  chunkSize: z.number().int().positive().multipleOf(4096).max(1 << 30),
  checksums: z.array(checksum),
  /** The content digest naming the blob in the store. */
  blob: digest,
  tensors: z.array(TensorSchema).default([])
}).superRefine((region, ctx) => {
  const expected = Math.ceil(region.size / region.chunkSize);
  if (region.checksums.length !== expected) {
    ctx.addIssue({
      code: "custom",
      path: ["checksums"],
      message: `${region.size} bytes in chunks of ${region.chunkSize} need ${expected} checksums, found ${region.checksums.length}`
    });
  } else if (blobDigest(region.size, region.chunkSize, region.checksums) !== region.blob) {
    ctx.addIssue({ code: "custom", path: ["blob"], message: "the blob name is not the digest of the region's size, chunk size and checksums" });
  }
  region.tensors.forEach((t, i) => {
    if (t.offset > region.size) {
      ctx.addIssue({ code: "custom", path: ["tensors", i, "offset"], message: `offset ${t.offset} lies beyond the region's ${region.size} bytes` });
    }
  });
});
var RankSchema = z.object({
  rank: z.number().int().nonnegative(),
  /** The GPU the rank's regions were captured from (null for host memory). */
  device: z.object({ uuid: z.string(), name: z.string() }).nullable(),
  regions: z.array(RegionSchema)
}).superRefine((rank, ctx) => {
  const seen = /* @__PURE__ */ new Set();
  rank.regions.forEach((r, i) => {
    if (seen.has(r.key)) ctx.addIssue({ code: "custom", path: ["regions", i, "key"], message: `duplicate region key '${r.key}'` });
    seen.add(r.key);
  });
});
var EngineSchema = z.object({
  kind: z.string().min(1),
  version: z.string().min(1),
  pluginVersion: z.string().nullable().default(null),
  attentionBackend: z.string().nullable().default(null)
});
var ModelSchema = z.object({
  id: z.string().min(1),
  revision: z.string().nullable().default(null),
  dtype: z.string().nullable().default(null),
  quantization: z.string().nullable().default(null),
  tensorParallelSize: z.number().int().positive().default(1),
  pipelineParallelSize: z.number().int().positive().default(1)
});
var PlatformSchema = z.object({
  /** `cuda` for GPU memory, `host` for host memory regions. */
  kind: z.enum(["cuda", "host"]),
  gpuName: z.string().nullable().default(null),
  computeCapability: z.string().nullable().default(null),
  /** The CUDA version the driver supports (cuDriverGetVersion, e.g. 13000). */
  driverCudaVersion: z.number().int().nonnegative().nullable().default(null),
  vmmGranularity: z.number().int().positive().nullable().default(null)
});
var ExpectedResponseSchema = z.object({
  prompt: z.string(),
  maxTokens: z.number().int().positive(),
  tokenIds: z.array(z.number().int().nonnegative()),
  text: z.string(),
  logprobs: z.array(z.number()).nullable().default(null)
}).superRefine((r, ctx) => {
  if (r.tokenIds.length > r.maxTokens) {
    ctx.addIssue({ code: "custom", path: ["tokenIds"], message: `${r.tokenIds.length} token ids, more than maxTokens (${r.maxTokens})` });
  }
  if (r.logprobs !== null && r.logprobs.length !== r.tokenIds.length) {
    ctx.addIssue({ code: "custom", path: ["logprobs"], message: `${r.logprobs.length} logprobs for ${r.tokenIds.length} token ids: one per token expected` });
  }
});
var ManifestSchema = z.object({
  schemaVersion: z.literal(1),
  id: z.string().regex(/^[0-9a-z-]{8,64}$/, "a snapshot id (lowercase letters, digits, dashes)"),
  name: z.string().min(1),
  createdAt: z.iso.datetime(),
  vsnapVersion: z.string().min(1),
  checksumAlgorithm: z.literal("xxh3-128"),
  engine: EngineSchema.nullable().default(null),
  model: ModelSchema.nullable().default(null),
  platform: PlatformSchema,
  ranks: z.array(RankSchema).min(1),
  /** A short greedy completion taken at capture, re-run after every restore. */
  expectedResponse: ExpectedResponseSchema.nullable().default(null),
  labels: z.record(z.string(), z.string()).default({})
}).superRefine((m, ctx) => {
  m.ranks.forEach((r, i) => {
    if (r.rank !== i) ctx.addIssue({ code: "custom", path: ["ranks", i, "rank"], message: `ranks must be listed in order: expected ${i}` });
  });
  let total = 0;
  for (const rank of m.ranks) for (const region of rank.regions) total += region.size;
  if (!Number.isSafeInteger(total)) {
    ctx.addIssue({ code: "custom", path: ["ranks"], message: `the regions total ${total} bytes, beyond 2^53 - 1: sizes cannot be exact` });
  }
});

// src/manifest/manifest.ts
function formatPath(path) {
  let out = "";
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else out += out ? `.${String(p)}` : String(p);
  }
  return out || "(root)";
}
function toIssues(error) {
  return error.issues.map((i) => ({ path: formatPath(i.path), message: i.message }));
}
var Manifest = class _Manifest {
  /** The validated data. */
  data;
  constructor(data) {
    this.data = data;
  }
  /**
   * Validates `input` (parsed JSON, or a JSON string) against schema v1. Throws
   * E_MANIFEST_INVALID listing every problem with its path.
   */
  static parse(input, source = "manifest") {
    let value = input;
    if (typeof input === "string") {
      try {
        value = JSON.parse(input);
      } catch (err) {
        throw new VsnapError("E_MANIFEST_INVALID", `${source} is not valid JSON: ${err.message}`, {
          issues: [{ path: "(root)", message: "not JSON" }]
        });
      }
    }
    const version = value?.schemaVersion;
    if (typeof version === "number" && version > 1) {
      throw new VsnapError("E_MANIFEST_INVALID", `${source} has schema version ${version}; this vsnap reads version 1. Upgrade vsnap.`, {
        issues: [{ path: "schemaVersion", message: `unsupported version ${version}` }]
      });
    }
    const result = ManifestSchema.safeParse(value);
    if (!result.success) {
      const issues = toIssues(result.error);
      throw new VsnapError(
        "E_MANIFEST_INVALID",
        `${source} is invalid (${issues.length} problem${issues.length === 1 ? "" : "s"}):
` + issues.map((i) => `  - ${i.path}: ${i.message}`).join("\n"),
        { issues }
      );
    }
    return new _Manifest(result.data);
  }
  /** The snapshot's name. */
  get name() {
    return this.data.name;
  }
  /** The snapshot's id (unique in the store, sortable by creation time). */
  get id() {
    return this.data.id;
  }
  /** Bytes of region data across all ranks. */
  get totalBytes() {
    return this.data.ranks.reduce((sum, rank) => sum + rank.regions.reduce((s, r) => s + r.size, 0), 0);
  }
  /** Number of regions across all ranks. */
  get regionCount() {
    return this.data.ranks.reduce((n, rank) => n + rank.regions.length, 0);
  }
  /** Every region with its rank, in manifest order. */
  *regions() {
    for (const rank of this.data.ranks) for (const region of rank.regions) yield { rank: rank.rank, region };
  }
  /** Every difference from a live layout (empty when compatible). Regions are matched by key. */
  checkCompatibility(live) {
    return findMismatches(this.data, live);
  }
  /** Throws E_MANIFEST_MISMATCH listing every difference from the live layout, if any. */
  assertCompatible(live) {
    const mismatches = this.checkCompatibility(live);
    if (mismatches.length === 0) return;
    const shown = mismatches.slice(0, 20).map((m) => `  - ${m.message}`);
    if (mismatches.length > 20) shown.push(`  - ... and ${mismatches.length - 20} more (see details.mismatches)`);
    throw new VsnapError(
      "E_MANIFEST_MISMATCH",
      `snapshot '${this.name}' (${this.id}) does not match the live layout; refusing to restore. ${mismatches.length} difference${mismatches.length === 1 ? "" : "s"}:
${shown.join("\n")}
Restore a snapshot taken from this engine and model, or capture a new one.`,
      { snapshot: this.name, id: this.id, mismatches }
    );
  }
  /** The JSON form (what the store writes). */
  toJSON() {
    return this.data;
  }
};

// src/store/capture-txn.ts
import { chmodSync, lstatSync as lstatSync2, mkdirSync as mkdirSync2, renameSync as renameSync2, unlinkSync } from "node:fs";
import { rm } from "node:fs/promises";
import { dirname as dirname3, join as join2 } from "node:path";

// src/store/failpoints.ts
var reached = 0;
function failpoint(name) {
  const spec = process.env.VSNAP_FAILPOINTS;
  if (spec && spec.split(",").includes(name)) process.kill(process.pid, "SIGKILL");
  const at = process.env.VSNAP_FAILPOINT_AT;
  if (at !== void 0) {
    reached++;
    if (String(reached) === at) {
      process.stdout.write(`failpoint ${name}
`);
      process.kill(process.pid, "SIGKILL");
    }
  }
}

// src/store/fsutil.ts
import { closeSync as closeSync2, fsyncSync, mkdirSync, openSync, renameSync, writeSync as writeSync2 } from "node:fs";
import { dirname as dirname2 } from "node:path";
function fsyncDir(path) {
  const fd = openSync(path, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync2(fd);
  }
}
function mkdirDurable(path) {
  const first = mkdirSync(path, { recursive: true });
  if (first !== void 0) fsyncDir(dirname2(first));
}
function writeFileDurable(tmpPath, data, mode = 420) {
  const fd = openSync(tmpPath, "w", mode);
  try {
    const buf = Buffer.from(data);
    let done = 0;
    while (done < buf.length) done += writeSync2(fd, buf, done, buf.length - done);
    fsyncSync(fd);
  } finally {
    closeSync2(fd);
  }
}
function replaceFileAtomic(path, tmpPath, data, mode = 420) {
  writeFileDurable(tmpPath, data, mode);
  renameSync(tmpPath, path);
  fsyncDir(dirname2(path));
}

// src/store/lock.ts
import { closeSync as closeSync4 } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

// src/store/layout.ts
import { closeSync as closeSync3, constants, lstatSync, openSync as openSync2, readSync as readSync2 } from "node:fs";
import { open } from "node:fs/promises";
function lstatOrUndefined(path) {
  try {
    return lstatSync(path);
  } catch (err) {
    const code = err.code;
    if (code === "ENOENT") return void 0;
    if (code === "ENOTDIR") {
      throw new VsnapError("E_STORE_INVALID", `${path} cannot exist: one of its parents is not a directory. Remove the stray file.`, { path });
    }
    throw toVsnapError(err);
  }
}
function linkRefused(path) {
  return new VsnapError(
    "E_STORE_UNSAFE",
    `${path} is a symbolic link inside the store; vsnap never follows links below a store's root, so it refuses to use it. Replace the link by the directory or file itself (or move the whole store and point vsnap at its real location).`,
    { path }
  );
}
function checkEntry(path, kind) {
  const st = lstatOrUndefined(path);
  if (!st) return false;
  if (st.isSymbolicLink()) throw linkRefused(path);
  const ok = kind === "dir" ? st.isDirectory() : st.isFile();
  if (!ok) {
    throw new VsnapError("E_STORE_INVALID", `${path} should be a ${kind === "dir" ? "directory" : "regular file"} of the store; something else is there. Move it away.`, {
      path
    });
  }
  return true;
}
var O_READ_NOFOLLOW = constants.O_RDONLY | constants.O_NOFOLLOW;
function readError(path, err) {
  const code = err.code;
  if (code === "ELOOP") return linkRefused(path);
  if (code === "ENOTDIR") return new VsnapError("E_STORE_INVALID", `${path} cannot be read: one of its parents is not a directory. Remove the stray file.`, { path });
  return toVsnapError(err);
}
async function readStoreText(path) {
  let handle;
  try {
    handle = await open(path, O_READ_NOFOLLOW);
  } catch (err) {
    if (err.code === "ENOENT") return void 0;
    throw readError(path, err);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw new VsnapError("E_STORE_INVALID", `${path} should be a regular file of the store; something else is there.`, { path });
    return await handle.readFile("utf8");
  } catch (err) {
    throw readError(path, err);
  } finally {
    await handle.close();
  }
}
function readStoreTextSync(path) {
  let fd;
  try {
    fd = openSync2(path, O_READ_NOFOLLOW);
  } catch (err) {
    if (err.code === "ENOENT") return void 0;
    throw readError(path, err);
  }
  try {
    const chunks = [];
    const buf = Buffer.alloc(4096);
    for (; ; ) {
      const n = readSync2(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      chunks.push(Buffer.from(buf.subarray(0, n)));
      if (chunks.length > 256) throw new VsnapError("E_STORE_INVALID", `${path} is far larger than a store pointer file`, { path });
    }
    return Buffer.concat(chunks).toString("utf8");
  } catch (err) {
    throw readError(path, err);
  } finally {
    closeSync3(fd);
  }
}
var ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
function parseCurrent(text) {
  const lines = text.split("\n").filter((l) => l.length > 0);
  const id = lines[0]?.trim() ?? "";
  const seqText = lines[1]?.trim();
  const seq = seqText === void 0 ? 0 : Number(seqText);
  if (lines.length > 2 || !ID.test(id) || !Number.isSafeInteger(seq) || seq < 0) return { junk: text.slice(0, 200) };
  return { id, seq };
}
function parseSeq(text) {
  const n = Number(text?.trim() ?? "0");
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
}

// src/store/lock.ts
async function acquireLock(path, exclusive, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let wait = 5;
  for (; ; ) {
    const release = tryLock(path, exclusive);
    if (release) return release;
    if (Date.now() >= deadline) {
      throw new VsnapError(
        "E_STORE_LOCKED",
        `could not take the ${exclusive ? "exclusive" : "shared"} store lock ${path} within ${timeoutMs} ms: another vsnap process is capturing, removing or collecting garbage. Retry, or raise lockTimeoutMs.`,
        { path }
      );
    }
    await sleep(wait);
    wait = Math.min(wait * 2, 200);
  }
}
function tryLock(path, exclusive) {
  checkEntry(path, "file");
  let fd;
  try {
    fd = native().tryLockFile(path, exclusive);
  } catch (err) {
    throw toVsnapError(err);
  }
  if (fd < 0) return void 0;
  let released = false;
  return () => {
    if (!released) {
      released = true;
      closeSync4(fd);
    }
  };
}

// src/store/capture-txn.ts
var CaptureTransaction = class _CaptureTransaction {
  id;
  dir;
  store;
  name;
  /** The store's publish sequence number when this capture started. */
  startSeq;
  releaseOwnLock;
  done = false;
  constructor(store, name, id, startSeq, releaseOwnLock) {
    this.store = store;
    this.name = name;
    this.id = id;
    this.startSeq = startSeq;
    this.dir = join2(store.root, "tmp", id);
    this.releaseOwnLock = releaseOwnLock;
  }
  static begin(store, name, id, startSeq) {
    const release = tryLock(join2(store.root, "tmp", `${id}.lock`), true);
    if (!release) throw new VsnapError("E_INTERNAL", `capture id ${id} is already in use`);
    const txn = new _CaptureTransaction(store, name, id, startSeq, release);
    try {
      mkdirSync2(txn.dir);
    } catch (err) {
      release();
      throw toVsnapError(err);
    }
    return txn;
  }
  /** Where region number `index` is written during the capture. */
  blobTmpPath(index) {
    return join2(this.dir, `${index}.blob`);
  }
  /**
   * Publishes the captured blobs and the manifest. Blobs are placed holding the blob lock shared
   * (only gc is excluded; restores and verifies go on): renamed into blobs/ (over an identical
   * stored blob, which they replace), their directories fsynced. Then, holding the meta lock for
   * a moment: the manifest, and `current` unless a capture of this name was published after this
   * one started (the store's publish sequence, not the wall clock, decides). A crash before the
   * manifest leaves only unreferenced blobs (removed by gc); before `current`, a complete but
   * non-current capture. Returns how many bytes were already stored.
   */
  async publish(manifest, blobs) {
    let dedupedBytes = 0;
    try {
      if (manifest.name !== this.name || manifest.id !== this.id) {
        throw new VsnapError("E_INTERNAL", `capture ${this.id} of '${this.name}' was asked to publish manifest ${manifest.id} of '${manifest.name}'`);
      }
      await this.store.withLock(false, async () => {
        const touched = /* @__PURE__ */ new Set();
        const placed = /* @__PURE__ */ new Set();
        for (const blob of blobs) {
          const dest = this.store.blobPath(blob.digest);
          if (placed.has(blob.digest)) {
            unlinkSync(blob.tmpPath);
            dedupedBytes += blob.size;
            continue;
          }
          if (exists(dest)) dedupedBytes += blob.size;
          mkdirDurable(dirname3(dest));
          chmodSync(blob.tmpPath, 292);
          renameSync2(blob.tmpPath, dest);
          placed.add(blob.digest);
          touched.add(dirname3(dest));
          failpoint("publish.blob");
        }
        for (const dir of touched) fsyncDir(dir);
        failpoint("publish.after-blobs");
        await this.store.withMetaLock(async () => {
          failpoint("publish.meta-locked");
          this.store.snapshotDirExists(this.name, true);
          const manifestTmp = join2(this.dir, "manifest.json");
          this.store.writeManifestTmp(manifestTmp, manifest);
          failpoint("publish.manifest-written");
          renameSync2(manifestTmp, this.store.manifestPath(this.name, manifest.id));
          fsyncDir(dirname3(this.store.manifestPath(this.name, manifest.id)));
          failpoint("publish.after-manifest");
          const current = await this.store.readCurrent(this.name);
          const newer = current !== void 0 && !("junk" in current) && current.id !== manifest.id && current.seq > this.startSeq;
          if (!newer) {
            const seq = this.store.nextSeq(current && !("junk" in current) ? current.seq : 0);
            failpoint("publish.seq-taken");
            this.store.writeCurrent(this.name, manifest.id, seq, join2(this.dir, "current"));
            failpoint("publish.after-current");
          }
        });
      });
    } catch (err) {
      await this.abort();
      throw toVsnapError(err);
    }
    await this.abort();
    return { dedupedBytes };
  }
  /** Throws away whatever is left of the capture. Idempotent. */
  async abort() {
    if (this.done) return;
    this.done = true;
    try {
      await rm(this.dir, { recursive: true, force: true });
      await rm(`${this.dir}.lock`, { force: true });
    } finally {
      this.releaseOwnLock();
    }
  }
};
function exists(path) {
  try {
    lstatSync2(path);
    return true;
  } catch {
    return false;
  }
}

// src/store/names.ts
var NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
function validateName(name, what = "snapshot name") {
  if (typeof name !== "string" || !NAME.test(name)) {
    const shown = typeof name === "string" ? JSON.stringify(name.length > 140 ? `${name.slice(0, 140)}\u2026` : name) : String(name);
    const hint = typeof name === "string" && name.length > 128 ? "it is longer than 128 characters" : 'use 1-128 letters, digits, ".", "_" or "-", starting with a letter or digit';
    throw new VsnapError("E_INVALID_NAME", `invalid ${what} ${shown}: ${hint}`, { name });
  }
  return name;
}

// src/regions/memory.ts
function toNativeMemory(memory) {
  switch (memory.kind) {
    case "host":
    case "imported":
      return { kind: memory.kind, fd: memory.fd };
    case "device":
      return { kind: "device", allocation: memory.allocation.handle };
  }
}
function memoryDevice(memory) {
  if (memory.kind === "device") return memory.allocation.device;
  return memory.kind === "imported" ? memory.device : void 0;
}

// src/transfer/staging.ts
import { availableParallelism } from "node:os";
var DEFAULT_CHUNK_SIZE = 64 * 1024 * 1024;
var IDLE_RELEASE_MS = Number(process.env.VSNAP_STAGING_IDLE_MS ?? 3e4);
function defaultThreads(devices = 1) {
  return Math.max(1, Math.min(16 * Math.max(1, devices), availableParallelism()));
}
var StagingPools = class {
  entries = /* @__PURE__ */ new Map();
  /**
   * Lends the pool of `slotSize` slots, made on first use with two slots for each of `threads`
   * workers (at least the default count for one GPU). A later job that wants more workers runs as many as the pool has slots for: a
   * pool is never made again for a different thread count, so pinning stays off the swap path.
   */
  async lease(slotSize, pinDevice, threads, use) {
    const key = `${slotSize}:${pinDevice >= 0 ? "pinned" : "host"}`;
    let entry = this.entries.get(key);
    if (!entry) {
      const slots = 2 * Math.max(threads, defaultThreads());
      const created = native().createStagingPool(slotSize, slots, pinDevice);
      entry = { pool: created, users: 0 };
      this.entries.set(key, entry);
      created.catch(() => this.entries.delete(key));
    }
    if (entry.timer) clearTimeout(entry.timer);
    entry.timer = void 0;
    entry.users++;
    try {
      let pool;
      try {
        pool = await entry.pool;
      } catch (err) {
        throw toVsnapError(err);
      }
      return await use(pool);
    } finally {
      entry.users--;
      if (entry.users === 0) {
        entry.timer = setTimeout(() => this.drop(key), IDLE_RELEASE_MS);
        entry.timer.unref();
      }
    }
  }
  /** Frees every idle pool now. */
  async releaseIdle() {
    for (const [key, entry] of this.entries) if (entry.users === 0) this.drop(key);
  }
  drop(key) {
    const entry = this.entries.get(key);
    if (!entry || entry.users > 0) return;
    this.entries.delete(key);
    if (entry.timer) clearTimeout(entry.timer);
    entry.pool.then((p) => p.close(), () => void 0);
  }
};
var REGISTRY = /* @__PURE__ */ Symbol.for("vsnap.stagingPools.v1");
var stagingPools = globalThis[REGISTRY] ?? (globalThis[REGISTRY] = new StagingPools());

// src/transfer/transfer.ts
function passOn(options) {
  return {
    ...options.onProgress ? { onProgress: options.onProgress } : {},
    ...options.signal ? { signal: options.signal } : {},
    ...options.threads ? { threads: options.threads } : {}
  };
}
function needsStaging(request) {
  switch (request.op) {
    case "copy":
      return false;
    case "verify":
      return true;
    case "capture":
      return request.regions.some((r) => r.memory?.kind !== "buffer" && r.hostCopy === void 0);
    case "hydrate":
      return request.verifyFirst === true || request.regions.some((r) => r.memory?.kind !== "buffer");
  }
}
async function runTransfer(request) {
  const { signal } = request;
  if (signal?.aborted) throw abortError(signal, `${request.op} of '${request.label}'`);
  const slotSize = Math.max(DEFAULT_CHUNK_SIZE, ...request.regions.map((r) => r.chunkSize));
  const devices = request.regions.map((r) => r.memory && r.memory.kind !== "buffer" ? memoryDevice(r.memory) : void 0).filter((d) => d !== void 0);
  const needsPinning = devices.length > 0 || request.regions.some((r) => r.memory?.kind === "imported");
  const pinDevice = needsPinning ? devices[0] ?? 0 : -1;
  const threads = request.threads ?? defaultThreads(new Set(devices).size);
  const regions = request.regions.map((r) => ({
    name: r.name,
    ...r.blobPath !== void 0 ? { blobPath: r.blobPath } : {},
    size: r.size,
    chunkSize: r.chunkSize,
    ...r.checksums ? { checksums: r.checksums } : {},
    ...r.memory ? { memory: r.memory.kind === "buffer" ? r.memory : toNativeMemory(r.memory) } : {},
    ...r.hostCopy ? { hostCopy: r.hostCopy } : {}
  }));
  const withPool = (use) => needsStaging(request) ? stagingPools.lease(slotSize, pinDevice, threads, use) : use(void 0);
  return withPool(async (pool) => {
    const onProgress = request.onProgress;
    let handle;
    try {
      handle = native().startTransfer(
        {
          op: request.op,
          label: request.label,
          ...pool ? { pool } : {},
          threads,
          directIo: request.directIo ?? false,
          verifyFirst: request.verifyFirst ?? false,
          regions
        },
        onProgress ? (done, total, phase) => onProgress({ phase, bytesDone: done, bytesTotal: total }) : void 0
      );
    } catch (err) {
      throw toVsnapError(err);
    }
    const cancel = () => handle.cancel();
    signal?.addEventListener("abort", cancel, { once: true });
    try {
      return await handle.promise;
    } catch (err) {
      const e = toVsnapError(err);
      if (e.code === "E_ABORTED" && signal?.aborted) throw abortError(signal, `${request.op} of '${request.label}'`);
      throw e;
    } finally {
      signal?.removeEventListener("abort", cancel);
    }
  });
}

// src/store/verify.ts
async function verifyManifest(store, manifest, options) {
  const started = performance.now();
  const problems = [];
  const regions = [];
  for (const { rank, region } of manifest.regions()) {
    try {
      regions.push({ rank, key: region.key, blobPath: store.blobPath(region.blob), size: region.size, chunkSize: region.chunkSize, checksums: region.checksums });
    } catch (err) {
      const e = toVsnapError(err);
      problems.push({ rank, region: region.key, code: e.code, message: e.message });
    }
  }
  const job = (subset, onProgress) => runTransfer({
    op: "verify",
    label: manifest.name,
    regions: subset.map((r) => ({ name: r.key, blobPath: r.blobPath, size: r.size, chunkSize: r.chunkSize, checksums: r.checksums })),
    ...options.signal ? { signal: options.signal } : {},
    ...options.threads ? { threads: options.threads } : {},
    directIo: options.directIo ?? false,
    ...onProgress ? { onProgress } : {}
  });
  let damaged = false;
  try {
    await job(regions, options.onProgress);
  } catch (err) {
    const e = toVsnapError(err);
    if (e.code === "E_ABORTED" || e.code === "E_NATIVE_LOAD" || e.code === "E_INVALID_ARGUMENT") throw e;
    damaged = true;
  }
  if (damaged) {
    for (const entry of regions) {
      try {
        await job([entry]);
      } catch (err) {
        const e = toVsnapError(err);
        if (e.code === "E_ABORTED") throw e;
        problems.push({ rank: entry.rank, region: entry.key, code: e.code, message: e.message });
      }
    }
  }
  return {
    name: manifest.name,
    id: manifest.id,
    ok: problems.length === 0,
    bytes: manifest.totalBytes,
    seconds: (performance.now() - started) / 1e3,
    problems
  };
}

// src/store/region-store.ts
var FORMAT_FILE = "vsnap-store.json";
var FORMAT = 1;
var SEQ_FILE = "publish-seq";
var SPACE_MARGIN = 256 * 1024 * 1024;
var DIGEST = /^[0-9a-f]{64}$/;
var TMP_GRACE_MS = 6e4;
var RegionStore = class _RegionStore {
  /** The store's directory (the real path, links above the root resolved once at open). */
  root;
  /** @internal */
  lockTimeoutMs;
  spaceMargin;
  /** The publish sequence number read when each capture id of this store was made. */
  startSeqs = /* @__PURE__ */ new Map();
  constructor(root, lockTimeoutMs, spaceMargin) {
    this.root = root;
    this.lockTimeoutMs = lockTimeoutMs;
    this.spaceMargin = spaceMargin;
  }
  /** Opens (and by default creates) the store at `root`. */
  static async open(root, options = {}) {
    if (typeof root !== "string" || root.length === 0) {
      throw new VsnapError("E_INVALID_ARGUMENT", `store root must be a directory path, got ${JSON.stringify(root)}`);
    }
    const create = options.create ?? true;
    let real;
    try {
      let exists2 = true;
      try {
        lstatSync3(root);
      } catch {
        exists2 = false;
      }
      if (!exists2) {
        if (!create) throw new VsnapError("E_STORE_INVALID", `no store at ${root} (pass create: true to make one)`, { root });
        mkdirSync3(root, { recursive: true, mode: 493 });
      }
      real = realpathSync(root);
      checkEntry(real, "dir");
      const formatPath2 = join3(real, FORMAT_FILE);
      const formatText = await readStoreText(formatPath2);
      if (formatText === void 0) {
        const entries = readdirSync(real).filter((e) => e !== ".lock" && e !== ".meta.lock");
        if (entries.length > 0) {
          throw new VsnapError(
            "E_STORE_INVALID",
            `${root} is not empty and is not a vsnap store (no ${FORMAT_FILE}); refusing to write into it. Choose an empty or new directory.`,
            { root }
          );
        }
        if (!create) throw new VsnapError("E_STORE_INVALID", `no store at ${root}`, { root });
        replaceFileAtomic(formatPath2, join3(real, `.${FORMAT_FILE}.tmp`), `${JSON.stringify({ format: FORMAT })}
`);
      } else {
        let format;
        try {
          format = JSON.parse(formatText).format;
        } catch {
          format = void 0;
        }
        if (format !== FORMAT) {
          throw new VsnapError(
            "E_STORE_INVALID",
            `${root} has store format ${JSON.stringify(format)}; this vsnap reads format ${FORMAT}. Upgrade vsnap or use another directory.`,
            { root, format }
          );
        }
      }
      for (const dir of ["blobs", "snapshots", "tmp"]) {
        if (!checkEntry(join3(real, dir), "dir")) mkdirSync3(join3(real, dir));
      }
      for (const file of [".lock", ".meta.lock", SEQ_FILE]) checkEntry(join3(real, file), "file");
    } catch (err) {
      throw toVsnapError(err);
    }
    const store = new _RegionStore(real, options.lockTimeoutMs ?? 3e4, options.spaceMarginBytes ?? SPACE_MARGIN);
    await store.cleanTmp(options.tmpGraceMs ?? TMP_GRACE_MS);
    return store;
  }
  /**
   * Where a blob lives. Throws E_STORE_UNSAFE if its prefix directory or the blob itself is a
   * link (so no reader or writer goes through one). @internal
   */
  blobPath(digest2) {
    if (typeof digest2 !== "string" || !DIGEST.test(digest2)) invalidDigest(digest2);
    const prefix = join3(this.root, "blobs", digest2.slice(0, 2));
    const path = join3(prefix, digest2);
    if (checkEntry(prefix, "dir")) checkEntry(path, "file");
    return path;
  }
  /** @internal */
  get lockPath() {
    return join3(this.root, ".lock");
  }
  /**
   * Runs `fn` holding the blob lock: shared (reading blobs, or placing new ones) or exclusive
   * (gc, which deletes them). @internal
   */
  async withLock(exclusive, fn) {
    const release = await acquireLock(this.lockPath, exclusive, this.lockTimeoutMs);
    try {
      return await fn();
    } finally {
      release();
    }
  }
  /** Runs `fn` holding the exclusive lock on manifests and `current` pointers (held briefly). @internal */
  async withMetaLock(fn) {
    const release = await acquireLock(join3(this.root, ".meta.lock"), true, this.lockTimeoutMs);
    try {
      return await fn();
    } finally {
      release();
    }
  }
  /** The store's publish sequence number now. @internal */
  readSeq() {
    return parseSeq(readStoreTextSync(join3(this.root, SEQ_FILE)));
  }
  /** Takes the next publish sequence number; call holding the meta lock. @internal */
  nextSeq(atLeast) {
    const next = Math.max(this.readSeq(), atLeast) + 1;
    replaceFileAtomic(join3(this.root, SEQ_FILE), join3(this.root, "tmp", `.seq-${randomBytes(6).toString("hex")}`), `${next}
`);
    return next;
  }
  /** The publish sequence number a capture id started at, if this store made the id. @internal */
  takeStartSeq(id) {
    const seq = this.startSeqs.get(id);
    this.startSeqs.delete(id);
    return seq;
  }
  /**
   * Starts a capture: checks free space for `bytes`, then makes a private tmp directory that
   * this process holds a lock on (so no cleaner removes it while in use).
   * @internal
   */
  async beginCapture(name, bytes, id = this.newCaptureId()) {
    validateName(name);
    try {
      const startSeq = this.takeStartSeq(id) ?? this.readSeq();
      this.checkFreeSpace(bytes);
      checkEntry(join3(this.root, "tmp"), "dir");
      return CaptureTransaction.begin(this, name, id, startSeq);
    } catch (err) {
      throw toVsnapError(err);
    }
  }
  /** A fresh capture id (unique; its time part orders history, not `current`). @internal */
  static newCaptureId() {
    return `${Date.now().toString(36).padStart(9, "0")}-${randomBytes(4).toString("hex")}`;
  }
  /**
   * A fresh capture id that remembers the store's publish sequence number now: a capture made
   * with it (even one persisted later from the RAM tier) becomes `current` unless another
   * capture of its name was published after this moment. @internal
   */
  newCaptureId() {
    const id = _RegionStore.newCaptureId();
    try {
      this.startSeqs.set(id, this.readSeq());
    } catch (err) {
      throw toVsnapError(err);
    }
    return id;
  }
  /** Throws E_NO_SPACE if the store's file system cannot take `bytes` more (plus a margin). */
  checkFreeSpace(bytes) {
    const fs = statfsSync(this.root);
    const free = fs.bavail * fs.bsize;
    if (free < bytes + this.spaceMargin) {
      const gib = (n) => `${(n / 2 ** 30).toFixed(2)} GiB`;
      throw new VsnapError(
        "E_NO_SPACE",
        `the store at ${this.root} has ${gib(free)} free; this capture needs up to ${gib(bytes)} plus a ${gib(this.spaceMargin)} margin. Free space (\`vsnap rm\` old snapshots, then \`vsnap gc\`) or use another store.`,
        { root: this.root, freeBytes: free, neededBytes: bytes + this.spaceMargin }
      );
    }
  }
  /**
   * Every snapshot with its current capture, sorted by name. Entries that cannot be read (a
   * damaged manifest or `current`, a stray file, a link) are reported in `problems` beside the
   * healthy ones.
   */
  async list() {
    return guard(async () => {
      const { names, problems } = await this.snapshotEntries();
      const out = [];
      for (const name of names.sort()) {
        try {
          const manifest = await this.current(name);
          if (!manifest) continue;
          const versions = (await this.manifestIds(name)).length;
          out.push({ name, id: manifest.id, createdAt: manifest.data.createdAt, bytes: manifest.totalBytes, regions: manifest.regionCount, versions });
        } catch (err) {
          const e = toVsnapError(err);
          problems.push({ name, code: e.code, message: e.message });
        }
      }
      problems.sort((x, y) => x.name < y.name ? -1 : x.name > y.name ? 1 : 0);
      return Object.defineProperty(out, "problems", { value: problems, enumerable: false });
    });
  }
  /** The newest good capture of `name`, or undefined if there is none. */
  async current(name) {
    const id = await this.currentId(name);
    return id === void 0 ? void 0 : this.readManifest(name, id);
  }
  /**
   * The id `current` names, if any. Throws E_STORE_INVALID when `current` holds something that
   * is not a capture id (it is never used as a path). @internal
   */
  async currentId(name) {
    validateName(name);
    const pointer = await this.readCurrent(name);
    if (pointer === void 0) return void 0;
    if ("junk" in pointer) {
      throw new VsnapError(
        "E_STORE_INVALID",
        `${this.currentPath(name)} does not name a capture (it holds ${JSON.stringify(pointer.junk.slice(0, 60))}). Capture '${name}' again (the new capture replaces it), or \`vsnap rm ${name}\`.`,
        { name, path: this.currentPath(name) }
      );
    }
    return pointer.id;
  }
  /** The `current` pointer of `name`, undefined when absent. @internal */
  async readCurrent(name) {
    return guard(async () => {
      if (!this.snapshotDirExists(name)) return void 0;
      const text = await readStoreText(this.currentPath(name));
      return text === void 0 ? void 0 : parseCurrent(text);
    });
  }
  /** A capture of `name`: the current one, or the one with `id`. Throws E_SNAPSHOT_NOT_FOUND. */
  async get(name, id) {
    validateName(name);
    if (id === void 0) {
      const m = await this.current(name);
      if (!m) throw new VsnapError("E_SNAPSHOT_NOT_FOUND", `no snapshot named '${name}' in ${this.root}`, { name, root: this.root });
      return m;
    }
    validateName(id, "snapshot id");
    return this.readManifest(name, id);
  }
  /** Every capture kept for `name`, oldest first. */
  async history(name) {
    validateName(name);
    const ids = await this.manifestIds(name);
    return Promise.all(ids.map((id) => this.readManifest(name, id)));
  }
  /**
   * Re-hashes every blob of a snapshot (at line rate, in parallel) against its manifest and
   * reports every problem found (a corrupt chunk, a truncated or missing blob).
   */
  async verify(name, options = {}) {
    const manifest = await this.get(name, options.id);
    return guard(() => this.withLock(false, () => verifyManifest(this, manifest, options)));
  }
  /**
   * Removes a snapshot (every capture of `name`), or one capture of it (`id`). When the current
   * capture is removed, `current` moves to the newest remaining one. Blob bytes are freed by
   * {@link RegionStore.gc}. Returns the ids removed.
   */
  async remove(name, options = {}) {
    validateName(name);
    if (options.id !== void 0) validateName(options.id, "snapshot id");
    return guard(
      () => this.withMetaLock(async () => {
        const dir = join3(this.root, "snapshots", name);
        const ids = await this.manifestIds(name);
        const targets = options.id === void 0 ? ids : ids.filter((i) => i === options.id);
        if (targets.length === 0) {
          throw new VsnapError("E_SNAPSHOT_NOT_FOUND", `no snapshot '${name}'${options.id ? ` with id '${options.id}'` : ""} in ${this.root}`, {
            name,
            id: options.id
          });
        }
        const remaining = ids.filter((i) => !targets.includes(i));
        const tmp = join3(this.root, "tmp", `.current-${randomBytes(6).toString("hex")}`);
        if (remaining.length > 0) {
          const current = await this.readCurrent(name);
          if (current === void 0 || "junk" in current || targets.includes(current.id)) {
            this.writeCurrent(name, remaining[remaining.length - 1], this.nextSeq(0), tmp);
          }
        } else {
          await rm2(join3(dir, "current"), { force: true });
        }
        for (const id of targets) await unlink(this.manifestPath(name, id));
        if (remaining.length === 0) await rm2(dir, { recursive: true, force: true });
        return targets;
      })
    );
  }
  /**
   * Deletes blobs no manifest references. Refuses (E_MANIFEST_INVALID, E_STORE_INVALID,
   * E_STORE_UNSAFE) if any manifest or snapshot directory cannot be read, rather than risk
   * deleting what it references. Stray files in `blobs/` or `snapshots/` are left alone.
   */
  async gc() {
    return guard(
      () => this.withLock(
        true,
        () => this.withMetaLock(async () => {
          const referenced = /* @__PURE__ */ new Set();
          const { names, problems } = await this.snapshotEntries();
          const unsafe = problems.find((p) => p.code === "E_STORE_UNSAFE");
          if (unsafe) throw new VsnapError("E_STORE_UNSAFE", `gc refused: ${unsafe.message}`, { name: unsafe.name });
          for (const name of names) {
            for (const id of await this.manifestIds(name)) {
              for (const { region } of (await this.readManifest(name, id)).regions()) referenced.add(region.blob);
            }
          }
          let blobsRemoved = 0;
          let bytesFreed = 0;
          for await (const blob of this.blobFiles()) {
            if (referenced.has(blob.digest)) continue;
            await unlink(blob.path);
            bytesFreed += blob.size;
            blobsRemoved++;
          }
          return { blobsRemoved, bytesFreed };
        })
      )
    );
  }
  /** Bytes and count of blobs on disk (after dedupe). */
  async usage() {
    return guard(async () => {
      let blobs = 0;
      let bytes = 0;
      for await (const blob of this.blobFiles()) {
        blobs++;
        bytes += blob.size;
      }
      return { blobs, bytes };
    });
  }
  /**
   * Every blob file on disk: regular files named by a digest inside a two-digit prefix directory.
   * Stray files are skipped; a link anywhere in blobs/ is refused (E_STORE_UNSAFE).
   */
  async *blobFiles() {
    const root = join3(this.root, "blobs");
    checkEntry(root, "dir");
    for (const prefix of await readdir(root, { withFileTypes: true })) {
      const prefixPath = join3(root, prefix.name);
      if (prefix.isSymbolicLink()) throw linkRefused(prefixPath);
      if (!prefix.isDirectory() || !/^[0-9a-f]{2}$/.test(prefix.name)) continue;
      for (const entry of await readdir(prefixPath, { withFileTypes: true })) {
        const path = join3(prefixPath, entry.name);
        if (entry.isSymbolicLink()) throw linkRefused(path);
        if (!entry.isFile() || !DIGEST.test(entry.name) || !entry.name.startsWith(prefix.name)) continue;
        let size;
        try {
          size = lstatSync3(path).size;
        } catch (err) {
          if (err.code === "ENOENT") continue;
          throw err;
        }
        yield { path, digest: entry.name, size };
      }
    }
  }
  /**
   * The snapshot directories under snapshots/ (dot-entries skipped), and every other entry there
   * as a problem: a link (E_STORE_UNSAFE), a stray file or an invalid name (E_STORE_INVALID).
   */
  async snapshotEntries() {
    const root = join3(this.root, "snapshots");
    checkEntry(root, "dir");
    const names = [];
    const problems = [];
    for (const entry of await readdir(root, { withFileTypes: true })) {
      if (entry.name.startsWith(".")) continue;
      const path = join3(root, entry.name);
      if (entry.isSymbolicLink()) {
        problems.push({ name: entry.name, code: "E_STORE_UNSAFE", message: linkRefused(path).message });
      } else if (!entry.isDirectory()) {
        problems.push({ name: entry.name, code: "E_STORE_INVALID", message: `${path} is a stray file, not a snapshot directory: move it out of the store.` });
      } else {
        try {
          names.push(validateName(entry.name));
        } catch (err) {
          problems.push({ name: entry.name, code: "E_STORE_INVALID", message: `${path} is not a valid snapshot name: ${err.message}` });
        }
      }
    }
    return { names, problems };
  }
  /** Nothing to release today; present so stores can be used with `await using`. */
  async close() {
  }
  /** Same as {@link RegionStore.close}. */
  async [Symbol.asyncDispose]() {
    await this.close();
  }
  /** @internal */
  manifestPath(name, id) {
    return join3(this.root, "snapshots", name, `${id}.json`);
  }
  /**
   * Whether snapshots/<name> exists: a real directory (never a link: E_STORE_UNSAFE), or absent.
   * `create` makes it (durably) when absent. @internal
   */
  snapshotDirExists(name, create = false) {
    checkEntry(join3(this.root, "snapshots"), "dir");
    const dir = join3(this.root, "snapshots", name);
    if (checkEntry(dir, "dir")) return true;
    if (!create) return false;
    mkdirSync3(dir);
    fsyncParent(dir);
    return true;
  }
  /** @internal Writes `current` (atomically: the rename replaces a link rather than following it). */
  writeCurrent(name, id, seq, tmpPath) {
    replaceFileAtomic(this.currentPath(name), tmpPath, `${id}
${seq}
`);
  }
  currentPath(name) {
    return join3(this.root, "snapshots", name, "current");
  }
  /** @internal */
  writeManifestTmp(tmpPath, manifest) {
    writeFileDurable(tmpPath, `${JSON.stringify(manifest.toJSON(), null, 1)}
`, 292);
  }
  async manifestIds(name) {
    if (!this.snapshotDirExists(name)) return [];
    const entries = await readdir(join3(this.root, "snapshots", name), { withFileTypes: true });
    return entries.filter((e) => (e.isFile() || e.isSymbolicLink()) && e.name.endsWith(".json") && !e.name.startsWith(".")).map((e) => e.name.slice(0, -5)).sort();
  }
  async readManifest(name, id) {
    const path = this.manifestPath(name, id);
    if (!this.snapshotDirExists(name)) {
      throw new VsnapError("E_SNAPSHOT_NOT_FOUND", `no snapshot named '${name}' in ${this.root}`, { name, id });
    }
    const text = await readStoreText(path);
    if (text === void 0) {
      throw new VsnapError("E_SNAPSHOT_NOT_FOUND", `no capture '${id}' of snapshot '${name}' in ${this.root} (${path} is missing)`, { name, id });
    }
    const manifest = Manifest.parse(text, path);
    if (manifest.id !== id || manifest.name !== name) {
      throw new VsnapError("E_MANIFEST_INVALID", `${path} holds capture '${manifest.id}' of '${manifest.name}', not '${id}' of '${name}': the store was edited by hand.`, {
        name,
        id,
        issues: [{ path: "id", message: "does not match the file name" }]
      });
    }
    return manifest;
  }
  /** Removes tmp/ entries of writers that died: unlocked, and older than a grace period. */
  async cleanTmp(graceMs) {
    await guard(async () => {
      const tmp = join3(this.root, "tmp");
      checkEntry(tmp, "dir");
      const now = Date.now();
      for (const entry of await readdir(tmp, { withFileTypes: true })) {
        const path = join3(tmp, entry.name);
        let mtime;
        try {
          mtime = lstatSync3(path).mtimeMs;
        } catch {
          continue;
        }
        if (now - mtime < graceMs) continue;
        if (entry.isSymbolicLink()) {
          await unlink(path);
        } else if (entry.name.endsWith(".lock") && entry.isFile()) {
          const release = tryLock(path, true);
          if (!release) continue;
          try {
            await rmEntry(path.slice(0, -".lock".length));
            await rm2(path, { force: true });
          } finally {
            release();
          }
        } else if (!existsEntry(`${path}.lock`)) {
          await rmEntry(path);
        }
      }
    });
  }
};
async function guard(fn) {
  try {
    return await fn();
  } catch (err) {
    throw toVsnapError(err);
  }
}
function invalidDigest(digest2) {
  throw new VsnapError("E_MANIFEST_INVALID", `${JSON.stringify(digest2)} is not a blob digest (64 lowercase hex digits)`, { digest: digest2 });
}
function existsEntry(path) {
  try {
    lstatSync3(path);
    return true;
  } catch {
    return false;
  }
}
async function rmEntry(path) {
  let st;
  try {
    st = lstatSync3(path);
  } catch {
    return;
  }
  if (st.isDirectory()) await rm2(path, { recursive: true, force: true });
  else await unlink(path);
}
function fsyncParent(dir) {
  fsyncDir(join3(dir, ".."));
}

// src/snapshot/persist.ts
async function persistFromRamTier(store, manifest, cache, options) {
  const lease = cache.hold(manifest.id);
  if (!lease) {
    throw new VsnapError(
      "E_NOT_DURABLE",
      `capture ${manifest.id} of '${manifest.name}' was kept only in the RAM tier, which no longer holds it (evicted or closed): it cannot be persisted. Capture it again.`,
      { name: manifest.name, id: manifest.id }
    );
  }
  try {
    const listed = [...manifest.regions()];
    const total = listed.reduce((sum, { region }) => sum + region.size, 0);
    const txn = await store.beginCapture(manifest.name, total, manifest.id);
    try {
      const result = await runTransfer({
        op: "capture",
        label: manifest.name,
        regions: listed.map(({ rank, region }, i) => ({
          name: region.key,
          blobPath: txn.blobTmpPath(i),
          size: region.size,
          chunkSize: region.chunkSize,
          memory: { kind: "buffer", buffer: lease.buffer, offset: lease.offsets.get(`${rank}/${region.key}`) }
        })),
        ...passOn(options)
      });
      listed.forEach(({ rank, region }, i) => {
        const sums = result.checksums?.[i] ?? [];
        const bad = region.checksums.findIndex((c, k) => sums[k] !== c);
        if (bad >= 0 || sums.length !== region.checksums.length) {
          throw new VsnapError(
            "E_CHECKSUM",
            `the RAM-tier copy of region '${region.key}' (rank ${rank}) of '${manifest.name}' changed since it was captured (chunk ${Math.max(bad, 0)}): nothing was persisted. Capture it again.`,
            { name: manifest.name, id: manifest.id, region: region.key, rank, chunk: Math.max(bad, 0) }
          );
        }
      });
      await txn.publish(manifest, listed.map(({ region }, i) => ({ tmpPath: txn.blobTmpPath(i), size: region.size, digest: region.blob })));
    } catch (err) {
      await txn.abort();
      throw toVsnapError(err);
    }
    cache.markDurable(manifest.id);
  } finally {
    lease.release();
  }
}

// src/snapshot/engine-flows.ts
import { closeSync as closeSync7, statSync } from "node:fs";

// src/ipc/fd-receiver.ts
import { randomBytes as randomBytes2 } from "node:crypto";
import { closeSync as closeSync5, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join as join4 } from "node:path";
var FdReceiver = class _FdReceiver {
  /** The socket path peers connect to. */
  path;
  listener;
  ownedDir;
  pending = /* @__PURE__ */ new Map();
  rejections = [];
  closed = false;
  constructor(path, ownedDir) {
    this.path = path;
    this.ownedDir = ownedDir;
    try {
      this.listener = new (native()).FdListener(path, (event) => this.onEvent(event));
    } catch (err) {
      if (ownedDir) rmSync(ownedDir, { recursive: true, force: true });
      throw toVsnapError(err);
    }
    this.listener.unref();
  }
  /**
   * Starts listening. Without a path, the socket goes in a new private (0700) directory under
   * the system temp directory, removed again on close.
   */
  static async listen(path) {
    if (path !== void 0) {
      if (typeof path !== "string" || path.length === 0) invalidArgument("path", "a socket path", path);
      return new _FdReceiver(path, void 0);
    }
    const dir = mkdtempSync(join4(tmpdir(), "vsnap-"));
    return new _FdReceiver(join4(dir, "fd.sock"), dir);
  }
  /**
   * Authorises one transfer: returns a fresh nonce to give the peer, and a promise of its
   * message. The nonce works once; after `timeoutMs` (default 30 s) or an abort it stops working
   * and the promise rejects (E_TIMEOUT / E_ABORTED).
   */
  expect(options = {}) {
    return this.register(void 0, options);
  }
  /**
   * Offers descriptors to one peer: the peer that presents the returned nonce (with
   * {@link fetchFds}, or `vsnap_vllm.fdsend.fetch_fds` in Python) receives `header` and
   * duplicates of `fds` (yours stay open). `taken` resolves with what the peer sent when it
   * fetched them; after `timeoutMs` (default 30 s) the offer is withdrawn (E_TIMEOUT).
   */
  offer(header, fds, options = {}) {
    const { nonce, message } = this.register({ header: JSON.stringify(header), fds }, options);
    return { nonce, taken: message };
  }
  register(offer, options) {
    if (this.closed) throw new VsnapError("E_CLOSED", "this FdReceiver was closed");
    const nonce = randomBytes2(32).toString("hex");
    const timeoutMs = options.timeoutMs ?? 3e4;
    const message = new Promise((resolve2, reject) => {
      const finish = () => {
        clearTimeout(timer);
        options.signal?.removeEventListener("abort", onAbort);
        this.pending.delete(nonce);
        if (!this.closed) this.listener.forget(nonce);
        if (this.pending.size === 0 && !this.closed) this.listener.unref();
      };
      const onAbort = () => {
        finish();
        reject(abortError(options.signal, "waiting for descriptors"));
      };
      const timer = setTimeout(() => {
        finish();
        const recent = this.rejections.slice(-3);
        reject(
          new VsnapError(
            "E_TIMEOUT",
            `no peer sent descriptors to ${this.path} within ${timeoutMs} ms` + (recent.length ? `; rejected meanwhile: ${recent.join("; ")}` : ""),
            { path: this.path, rejected: recent }
          )
        );
      }, timeoutMs);
      this.pending.set(nonce, {
        resolve: (m) => {
          finish();
          resolve2(m);
        },
        reject: (e) => {
          finish();
          reject(e);
        }
      });
      if (options.signal?.aborted) return onAbort();
      options.signal?.addEventListener("abort", onAbort, { once: true });
      this.listener.ref();
      try {
        if (offer) this.listener.expect(nonce, offer.header, offer.fds);
        else this.listener.expect(nonce);
      } catch (err) {
        finish();
        reject(toVsnapError(err));
      }
    });
    return { nonce, message };
  }
  /** Stops listening and removes the socket; pending expectations reject with E_CLOSED. */
  close() {
    if (this.closed) return;
    this.closed = true;
    this.listener.close();
    for (const p of [...this.pending.values()]) p.reject(new VsnapError("E_CLOSED", "the FdReceiver was closed"));
    if (this.ownedDir) rmSync(this.ownedDir, { recursive: true, force: true });
  }
  /** Same as {@link FdReceiver.close}. */
  async [Symbol.asyncDispose]() {
    this.close();
  }
  onEvent(event) {
    if (event.type === "reject") {
      this.rejections.push(`pid ${event.pid}: ${event.reason}`);
      if (this.rejections.length > 20) this.rejections.shift();
      return;
    }
    const waiter = this.pending.get(event.nonce);
    if (!waiter) {
      for (const fd of event.fds) closeSync5(fd);
      return;
    }
    let header;
    try {
      header = JSON.parse(event.header);
    } catch {
      for (const fd of event.fds) closeSync5(fd);
      waiter.reject(new VsnapError("E_IPC_PROTOCOL", `pid ${event.pid} sent a header that is not JSON`));
      return;
    }
    waiter.resolve({ header, fds: event.fds, pid: event.pid });
  }
};

// src/engine/schemas.ts
import { z as z2 } from "zod";
var VersionSchema = z2.object({ version: z2.string() });
var ModelListSchema = z2.object({
  object: z2.literal("list"),
  data: z2.array(z2.object({ id: z2.string(), object: z2.string().optional(), owned_by: z2.string().optional(), root: z2.string().nullish(), max_model_len: z2.number().nullish() }).passthrough())
});
var IsSleepingSchema = z2.object({ is_sleeping: z2.boolean() });
var SleepAnswerSchema = z2.object({ status: z2.string(), level: z2.number().optional() }).passthrough();
var WakeAnswerSchema = z2.object({ status: z2.string(), tags_woken: z2.array(z2.string()).nullish() }).passthrough();
var CollectiveRpcSchema = z2.object({ results: z2.array(z2.unknown()) });
var CompletionSchema = z2.object({
  id: z2.string(),
  model: z2.string(),
  choices: z2.array(
    z2.object({
      index: z2.number(),
      text: z2.string(),
      finish_reason: z2.string().nullish(),
      logprobs: z2.object({ tokens: z2.array(z2.string()), token_logprobs: z2.array(z2.number().nullable()) }).passthrough().nullish()
    }).passthrough()
  ).min(1),
  usage: z2.object({ prompt_tokens: z2.number(), completion_tokens: z2.number() }).passthrough().optional()
});
var RankStatusSchema = z2.object({
  rank: z2.number().int().nonnegative(),
  pid: z2.number().int(),
  device: z2.object({ ordinal: z2.number().int(), uuid: z2.string() }),
  memory: z2.enum(["cuda", "host"]),
  sleepMode: z2.boolean(),
  hooks: z2.string().nullable(),
  weightsMapped: z2.boolean(),
  regions: z2.number().int(),
  bytes: z2.number(),
  attentionBackend: z2.string().nullable()
}).passthrough();
var VsnapStatusSchema = z2.object({
  engine: z2.object({ kind: z2.string(), version: z2.string(), pluginVersion: z2.string().nullable(), attentionBackend: z2.string().nullable() }),
  model: z2.object({
    id: z2.string(),
    revision: z2.string().nullable(),
    dtype: z2.string().nullable(),
    quantization: z2.string().nullable(),
    tensorParallelSize: z2.number().int().positive(),
    pipelineParallelSize: z2.number().int().positive()
  }),
  sleeping: z2.boolean(),
  ranks: z2.array(RankStatusSchema).min(1)
});
var VsnapExportSchema = z2.object({ ranks: z2.array(z2.object({ rank: z2.number(), regions: z2.number(), bytes: z2.number() }).passthrough()) });
var ExportHeaderSchema = z2.object({
  version: z2.literal(1),
  rank: z2.number().int().nonnegative(),
  pid: z2.number().int(),
  memory: z2.enum(["cuda", "host"]),
  device: z2.object({ ordinal: z2.number().int(), uuid: z2.string() }),
  regions: z2.array(
    z2.object({
      key: z2.string().min(1),
      tag: z2.string().min(1),
      va: z2.number().int().nonnegative(),
      size: z2.number().int().positive(),
      tensors: z2.array(z2.object({ name: z2.string(), offset: z2.number().int().nonnegative(), dtype: z2.string(), shape: z2.array(z2.number().int().nonnegative()) }))
    })
  )
});

// src/engine/control.ts
function viaRoutes(client) {
  return {
    via: "vsnap",
    status: (call) => client.vsnapStatus(call),
    exportTo: async (socket, nonces, call) => {
      await client.vsnapExport({ socket, nonces }, call);
    },
    sleep: (level, mode, call) => client.vsnapSleep({ level, ...mode ? { mode } : {} }, call),
    wake: (tags, call, adopt) => client.vsnapWake({ ...tags ? { tags } : {}, ...adopt ? { adopt } : {} }, call),
    resetPrefixCache: (call) => client.vsnapResetPrefixCache(call)
  };
}
function viaDevRoutes(client) {
  return {
    via: "dev",
    status: async (call) => {
      const ranks = await client.collectiveRpc("vsnap_status", {}, call) ?? [];
      const first = ranks[0] ?? {};
      const parsed = VsnapStatusSchema.safeParse({ engine: first.engine, model: first.model, sleeping: await client.isSleeping(call), ranks });
      if (!parsed.success) {
        throw new VsnapError("E_ENGINE_PROTOCOL", `the workers' vsnap_status has an unexpected shape: is the vsnap plugin of a matching version loaded?`, {
          issues: parsed.error.issues
        });
      }
      return parsed.data;
    },
    exportTo: async (socket, nonces, call) => {
      await client.collectiveRpc("vsnap_export", { args: [socket, [...nonces]] }, call);
    },
    sleep: (level, mode, call) => client.sleep({ level, ...mode ? { mode } : {} }, call),
    wake: async (tags, call, adopt) => {
      if (adopt) await client.collectiveRpc("vsnap_adopt", { args: [adopt.socket, [...adopt.nonces]] }, call);
      await client.wakeUp(tags ? { tags } : {}, call);
    },
    resetPrefixCache: (call) => client.resetPrefixCache(call)
  };
}
async function engineControl(client, call) {
  try {
    const control = viaRoutes(client);
    return { control, status: await control.status(call) };
  } catch (err) {
    if (!(err instanceof VsnapError && err.code === "E_ENGINE_HTTP" && err.details.status === 404)) throw err;
  }
  try {
    const control = viaDevRoutes(client);
    return { control, status: await control.status(call) };
  } catch (err) {
    if (err instanceof VsnapError && err.code === "E_ENGINE_HTTP" && err.details.status === 404) {
      throw new VsnapError(
        "E_ENGINE_STATE",
        `${client.baseUrl} has neither the vsnap routes nor vLLM's dev routes: load the plugin (VLLM_PLUGINS=vsnap, VSNAP_TOKEN=...) or start the engine with VLLM_SERVER_DEV_MODE=1`,
        { url: client.baseUrl },
        { cause: err }
      );
    }
    throw err;
  }
}

// src/engine/export.ts
import { closeSync as closeSync6 } from "node:fs";

// src/gpu/cuda.ts
async function cudaStatus() {
  try {
    const s = await native().cudaStatus();
    return { available: s.available, reason: s.reason, driverVersion: s.driverVersion, checkpointApi: s.checkpointApi };
  } catch (err) {
    throw toVsnapError(err);
  }
}
async function listDevices(options = {}) {
  try {
    return await native().cudaDevices(options.freeMemory ?? false);
  } catch (err) {
    throw toVsnapError(err);
  }
}

// src/engine/export.ts
async function exportRegions(control, rankCount, options = {}) {
  const started = performance.now();
  const receiver = await FdReceiver.listen();
  const received = [];
  try {
    const expected = Array.from({ length: rankCount }, () => receiver.expect({ timeoutMs: options.timeoutMs ?? 12e4, ...options.signal ? { signal: options.signal } : {} }));
    const messages = expected.map(
      (e) => e.message.then((m) => {
        received.push(...m.fds);
        return m;
      })
    );
    const exportCall = control.exportTo(receiver.path, expected.map((e) => e.nonce), options.signal ? { signal: options.signal } : {});
    const [, ...got] = await Promise.all([exportCall, ...messages]);
    const gpus = got.some((m) => m.header.memory === "cuda") ? await listDevices() : [];
    const ranks = got.map((m) => {
      const parsed = ExportHeaderSchema.safeParse(m.header);
      if (!parsed.success) {
        throw new VsnapError("E_ENGINE_PROTOCOL", `a worker (pid ${m.pid}) sent a region table of the wrong shape: ${parsed.error.issues[0]?.message}`, {
          issues: parsed.error.issues
        });
      }
      const h = parsed.data;
      if (h.regions.length !== m.fds.length) {
        throw new VsnapError("E_ENGINE_PROTOCOL", `rank ${h.rank} sent ${m.fds.length} descriptors for ${h.regions.length} regions`);
      }
      const gpu = h.memory === "cuda" ? gpus.find((g) => g.uuid === h.device.uuid) : void 0;
      const device = gpu?.ordinal;
      if (h.memory === "cuda") {
        if (device === void 0) {
          throw new VsnapError("E_CUDA_UNAVAILABLE", `rank ${h.rank}'s GPU ${h.device.uuid} is not visible to this process: give it the same GPUs as the engine (CUDA_VISIBLE_DEVICES)`, {
            uuid: h.device.uuid
          });
        }
      }
      const regions = h.regions.map((r, i) => ({
        rank: h.rank,
        key: r.key,
        tag: r.tag,
        va: r.va,
        size: r.size,
        tensors: r.tensors,
        memory: h.memory === "cuda" ? { kind: "imported", fd: m.fds[i], device } : { kind: "host", fd: m.fds[i] },
        device
      }));
      return { rank: h.rank, pid: h.pid, deviceUuid: h.device.uuid, memory: h.memory, ...gpu ? { gpu } : {}, regions };
    });
    ranks.sort((a, b) => a.rank - b.rank);
    ranks.forEach((r, i) => {
      if (r.rank !== i) throw new VsnapError("E_ENGINE_PROTOCOL", `ranks sent are ${ranks.map((x) => x.rank).join(",")}, expected 0..${rankCount - 1}`);
    });
    let closed = false;
    return {
      ranks,
      seconds: (performance.now() - started) / 1e3,
      close() {
        if (closed) return;
        closed = true;
        for (const fd of received) closeSync6(fd);
      },
      takeFds() {
        closed = true;
      }
    };
  } catch (err) {
    for (const fd of received) closeSync6(fd);
    throw toVsnapError(err);
  } finally {
    receiver.close();
  }
}

// src/snapshot/engine-flows.ts
var DEFAULT_PROMPT = "The capital of France is";
var RISKY_BACKENDS = /FLASHINFER/i;
function warn(options, message) {
  if (options.onWarning) options.onWarning(message);
  else process.emitWarning(message, { code: "VSNAP_ENGINE" });
}
function preflight(status, options) {
  const backend = status.engine.attentionBackend;
  if (backend && RISKY_BACKENDS.test(backend)) {
    warn(
      options,
      `the engine uses the ${backend} attention backend, which keeps workspace outside the sleep-mode allocator: after a wake its output can be fluent but wrong (vllm #31016). Serve with --attention-backend TRITON_ATTN; the expected-response check after each restore will catch the fault.`
    );
  }
  const off = status.ranks.filter((r) => !r.sleepMode);
  if (off.length) {
    throw new VsnapError("E_ENGINE_STATE", "the engine runs without sleep mode: start it with --enable-sleep-mode", { ranks: off.map((r) => r.rank) });
  }
}
function liveFacts(status, exported, allowModelSwap) {
  const m = status.model;
  const model = allowModelSwap ? { dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize } : { id: m.id, revision: m.revision, dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize };
  const engine = { kind: status.engine.kind, version: status.engine.version, pluginVersion: status.engine.pluginVersion, attentionBackend: status.engine.attentionBackend };
  const first = exported.ranks[0];
  if (first.memory === "host") return { engine, model, platform: { kind: "host" } };
  const device = first.gpu;
  return {
    engine,
    model,
    platform: { kind: "cuda", gpuName: device?.name ?? null, computeCapability: device?.computeCapability ?? null, vmmGranularity: device?.vmmGranularity ?? null }
  };
}
function liveRanks(exported) {
  return exported.ranks.map((r) => ({ regions: r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag })) }));
}
async function probe(client, prompt, maxTokens, signal) {
  const r = await client.completions({ prompt, max_tokens: maxTokens, temperature: 0, logprobs: 1 }, signal ? { signal } : {});
  return { prompt, maxTokens, tokenIds: r.tokenIds ?? [], text: r.text, logprobs: r.logprobs };
}
function compareResponses(expected, actual, tolerance) {
  if (expected.tokenIds.length && actual.tokenIds.length) {
    const i = expected.tokenIds.findIndex((t, k) => actual.tokenIds[k] !== t);
    if (i >= 0 || expected.tokenIds.length !== actual.tokenIds.length) {
      const at = i >= 0 ? i : Math.min(expected.tokenIds.length, actual.tokenIds.length);
      return `token ${at} differs: expected ${expected.tokenIds[at]}, got ${actual.tokenIds[at]}`;
    }
  } else if (expected.text !== actual.text) {
    return `text differs: expected ${JSON.stringify(expected.text.slice(0, 80))}, got ${JSON.stringify(actual.text.slice(0, 80))}`;
  }
  if (expected.logprobs && actual.logprobs) {
    let worst = 0;
    expected.logprobs.forEach((lp, k) => {
      worst = Math.max(worst, Math.abs(lp - (actual.logprobs[k] ?? Number.NaN)));
    });
    if (!(worst <= tolerance)) return `logprobs differ by up to ${worst} (tolerance ${tolerance})`;
  }
  return void 0;
}
async function putToSleep(control) {
  try {
    await control.sleep(2, void 0);
    return "the engine was put back to sleep";
  } catch (err) {
    return `putting the engine back to sleep failed too (${err.message}); check it before sending requests`;
  }
}
async function captureEngine(SnapshotClass, store, name, client, options) {
  const { control, status } = await engineControl(client, options.signal ? { signal: options.signal } : {});
  preflight(status, options);
  if (status.sleeping) {
    throw new VsnapError("E_ENGINE_STATE", "the engine is asleep: capture needs its weights awake (restore or wake it first)");
  }
  const exported = await exportRegions(control, status.ranks.length, options.signal ? { signal: options.signal } : {});
  try {
    return await captureExported(SnapshotClass, store, name, client, status, exported, options);
  } finally {
    exported.close();
  }
}
async function captureExported(SnapshotClass, store, name, client, status, exported, options) {
  const expected = await probe(client, options.probePrompt ?? DEFAULT_PROMPT, options.probeMaxTokens ?? 16, options.signal);
  return SnapshotClass.capture(store, name, {
    regions: exported.ranks.flatMap(
      (r) => r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag, rank: x.rank, memory: x.memory, tensors: x.tensors, ...x.device !== void 0 ? { device: x.device } : {} }))
    ),
    engine: status.engine,
    model: status.model,
    expectedResponse: expected,
    labels: { ...options.labels ?? {} },
    ...options.chunkSize ? { chunkSize: options.chunkSize } : {},
    ...options.cache ? { cache: options.cache } : {},
    ...options.persist ? { persist: options.persist } : {},
    ...passOn(options)
  });
}
async function restoreEngine(snapshot, client, options) {
  const started = performance.now();
  const phases = {};
  let mark = performance.now();
  const lap = (name) => {
    const now = performance.now();
    phases[name] = (now - mark) / 1e3;
    mark = now;
  };
  const call = options.signal ? { signal: options.signal } : {};
  const expected = snapshot.manifest.data.expectedResponse;
  const found = await engineControl(client, call);
  const control = found.control;
  let status = found.status;
  preflight(status, options);
  if (!status.sleeping) {
    if (!options.allowModelSwap) {
      throw new VsnapError(
        "E_ENGINE_STATE",
        "the engine is awake: restoring would overwrite a working model. Suspend it first, or pass allowModelSwap to swap models in place."
      );
    }
    await control.sleep(2, void 0, call);
    lap("sleep");
    status = await control.status(call);
  }
  const engineKey = client.baseUrl;
  const held = options.resident?.peek(engineKey);
  if (held && options.resident) {
    const usable = held.snapshotId === snapshot.id && status.ranks.every((r) => held.ranks[r.rank]?.pid === r.pid) && status.ranks.every((r) => !r.weightsMapped);
    if (usable) {
      try {
        const report = await adoptResident(control, held, call);
        lap("adoptWeights");
        await finishWake(control, client, snapshot, expected, options, call, lap);
        options.resident.release(engineKey);
        return { bytes: report.bytes, tier: "gpu", seconds: (performance.now() - started) / 1e3, phases };
      } catch (err) {
        warn(options, `tier-0 wake of '${snapshot.name}' failed (${err.message}); restoring from the snapshot instead`);
        await putToSleep(control);
        status = await control.status(call);
      }
    }
    options.resident.release(engineKey);
  }
  if (status.ranks.some((r) => !r.weightsMapped)) await control.wake(["weights"], call);
  lap("wakeWeights");
  let exported;
  try {
    exported = await exportRegions(control, status.ranks.length, call);
    lap("export");
    snapshot.manifest.assertCompatible({ ...liveFacts(status, exported, options.allowModelSwap ?? false), ranks: liveRanks(exported) });
    const result = await snapshot.restore({
      regions: exported.ranks.flatMap((r) => r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag, rank: x.rank, memory: x.memory }))),
      ...options.cache ? { cache: options.cache } : {},
      ...options.verify ? { verify: options.verify } : {},
      ...passOn(options),
      directIo: options.directIo ?? false
    });
    lap("hydrate");
    exported.close();
    await finishWake(control, client, snapshot, expected, options, call, lap);
    return { bytes: result.bytes, tier: result.tier ?? "store", seconds: (performance.now() - started) / 1e3, phases };
  } catch (err) {
    exported?.close();
    const e = toVsnapError(err);
    const state = await putToSleep(control);
    throw new VsnapError(
      e.code,
      `${e.message}
Restore of '${snapshot.name}' failed; ${state}. Retry the restore, or wake the engine and reload its weights with vLLM's reload_weights.`,
      { ...e.details, recovered: state.startsWith("the engine was put back") },
      { cause: e }
    );
  }
}
async function finishWake(control, client, snapshot, expected, options, call, lap) {
  await control.wake(["kv_cache"], call);
  lap("wakeKvCache");
  await control.resetPrefixCache(call);
  lap("resetPrefixCache");
  if (!expected) return;
  const actual = await probe(client, expected.prompt, expected.maxTokens, options.signal);
  lap("expectedResponse");
  const difference = compareResponses(expected, actual, options.logprobTolerance ?? 0);
  if (difference) {
    throw new VsnapError(
      "E_RESPONSE_MISMATCH",
      `after restoring '${snapshot.name}' the engine's answer differs from the one recorded at capture: ${difference}. The weights verified byte for byte, so state outside the snapshot is wrong (an attention backend such as FlashInfer keeps some).`,
      { expected, actual, difference }
    );
  }
}
async function adoptResident(control, held, call) {
  const receiver = await FdReceiver.listen();
  try {
    const offers = held.ranks.map((r) => receiver.offer({ regions: r.regions }, r.fds, { timeoutMs: 12e4, ...call.signal ? { signal: call.signal } : {} }));
    const taken = Promise.all(offers.map((o) => o.taken));
    await control.wake(["weights"], call, { socket: receiver.path, nonces: offers.map((o) => o.nonce) });
    for (const m of await taken) for (const fd of m.fds) closeSync7(fd);
    return { bytes: held.bytes };
  } finally {
    receiver.close();
  }
}
function blobProblems(snapshot) {
  const problems = [];
  for (const { region } of snapshot.manifest.regions()) {
    let size;
    try {
      size = statSync(snapshot.store.blobPath(region.blob)).size;
    } catch {
      size = void 0;
    }
    if (size !== region.size) problems.push(`blob of region ${JSON.stringify(region.key)} is ${size === void 0 ? "missing" : `${size} bytes, not ${region.size}`}`);
  }
  return problems;
}
async function restorable(snapshot, status, exported, options) {
  const mismatches = snapshot.manifest.checkCompatibility({ ...liveFacts(status, exported, false), ranks: liveRanks(exported) });
  const problems = [...mismatches.map((m) => m.message), ...blobProblems(snapshot)];
  if (problems.length === 0 && options.verifyBlobs) {
    const report = await snapshot.verify(options.signal ? { signal: options.signal } : {});
    problems.push(...report.problems.map((p) => p.message));
  }
  return problems;
}
async function restorableFor(SnapshotClass, store, name, client, options = {}) {
  const call = options.signal ? { signal: options.signal } : {};
  const current = await store.current(name);
  if (!current) return { restorable: false, cached: false, problems: [`the store has no snapshot '${name}'`] };
  const snapshot = SnapshotClass.of(store, current);
  const { control, status } = await engineControl(client, call);
  if (status.sleeping) {
    const problems = blobProblems(snapshot);
    return { restorable: problems.length === 0, cached: true, problems };
  }
  const exported = await exportRegions(control, status.ranks.length, call);
  try {
    const problems = await restorable(snapshot, status, exported, options);
    return { restorable: problems.length === 0, cached: true, problems };
  } finally {
    exported.close();
  }
}
async function suspendEngine(SnapshotClass, store, name, client, options) {
  const started = performance.now();
  const phases = {};
  let mark = started;
  const lap = (phase) => {
    const now = performance.now();
    phases[phase] = (now - mark) / 1e3;
    mark = now;
  };
  const call = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  const current = await store.current(name);
  if (status.sleeping) {
    if (!current) throw new VsnapError("E_NOT_RESTORABLE", `the engine is already asleep and the store has no snapshot '${name}'`, { name });
    return { snapshot: SnapshotClass.of(store, current), captured: false, alreadyAsleep: true, seconds: (performance.now() - started) / 1e3, phases: {} };
  }
  lap("status");
  preflight(status, options.onWarning ? { onWarning: options.onWarning } : options.capture ?? {});
  let snapshot = current ? SnapshotClass.of(store, current) : void 0;
  let exported;
  const exportWeights = async () => exported ??= await exportRegions(control, status.ranks.length, call);
  let captured = false;
  try {
    const problems = snapshot ? await restorable(snapshot, status, await exportWeights(), options) : [`the store has no snapshot '${name}'`];
    lap("check");
    if (problems.length) {
      if (!options.captureIfNeeded) {
        throw new VsnapError(
          "E_NOT_RESTORABLE",
          `refusing to suspend: its weights could not be brought back, so they stay on the GPU.
${problems.map((p) => `  - ${p}`).join("\n")}
Capture a snapshot first (Snapshot.captureEngine), or pass captureIfNeeded.`,
          { name, problems }
        );
      }
      snapshot = await captureExported(SnapshotClass, store, name, client, status, await exportWeights(), {
        ...options.capture ?? {},
        ...options.signal ? { signal: options.signal } : {}
      });
      captured = true;
      lap("capture");
    }
    if (options.resident) {
      await options.resident.hold(client.baseUrl, snapshot.id, await exportWeights());
      lap("hold");
    }
  } finally {
    exported?.close();
  }
  try {
    await control.sleep(2, options.mode, call);
    lap("sleep");
  } catch (err) {
    options.resident?.release(client.baseUrl);
    throw err;
  }
  return { snapshot, captured, alreadyAsleep: false, seconds: (performance.now() - started) / 1e3, phases };
}

// src/version.ts
var VERSION = "0.1.0";

// src/snapshot/capture-manifest.ts
function checkCaptureRegions(regions) {
  if (!Array.isArray(regions) || regions.length === 0) invalidArgument("regions", "a non-empty array", regions);
  const seen = /* @__PURE__ */ new Set();
  for (const [i, r] of regions.entries()) {
    if (typeof r?.key !== "string" || r.key.length === 0) invalidArgument(`regions[${i}].key`, "a non-empty string", r?.key);
    if (!Number.isSafeInteger(r.size) || r.size < 0) invalidArgument(`regions[${i}].size`, "a non-negative integer", r.size);
    const rank = r.rank ?? 0;
    if (!Number.isInteger(rank) || rank < 0) invalidArgument(`regions[${i}].rank`, "an integer >= 0", r.rank);
    const id = `${rank}/${r.key}`;
    if (seen.has(id)) invalidArgument(`regions[${i}].key`, `unique within rank ${rank}`, r.key);
    seen.add(id);
  }
}
function regionDevice(r) {
  if (r.memory.kind === "device") return r.memory.allocation.device;
  if (r.memory.kind === "imported") return r.device ?? r.memory.device ?? 0;
  return void 0;
}
async function platformOf(regions) {
  const device = regions.map(regionDevice).find((d) => d !== void 0);
  if (device === void 0) {
    return { platform: { kind: "host", gpuName: null, computeCapability: null, driverCudaVersion: null, vmmGranularity: null }, gpus: [] };
  }
  const status = await cudaStatus();
  if (!status.available) throw new VsnapError("E_CUDA_UNAVAILABLE", `CUDA is unavailable: ${status.reason}`, { reason: status.reason });
  const gpus = await listDevices();
  const info = gpus.find((d) => d.ordinal === device);
  if (!info) invalidArgument("device", "a visible CUDA device ordinal", device);
  return {
    platform: {
      kind: "cuda",
      gpuName: info.name,
      computeCapability: info.computeCapability,
      driverCudaVersion: status.driverVersion,
      vmmGranularity: info.vmmGranularity
    },
    gpus
  };
}
function captureManifest(c) {
  const rankCount = Math.max(...c.regions.map((r) => r.rank ?? 0)) + 1;
  const ranks = [];
  for (let rank = 0; rank < rankCount; rank++) {
    const mine = c.regions.map((r, i) => ({ r, i })).filter(({ r }) => (r.rank ?? 0) === rank);
    const dev = mine.map(({ r }) => regionDevice(r)).find((d) => d !== void 0);
    const info = c.gpus.find((d) => d.ordinal === dev);
    ranks.push({
      rank,
      device: info ? { uuid: info.uuid, name: info.name } : null,
      regions: mine.map(({ r, i }) => ({
        key: r.key,
        tag: r.tag ?? "weights",
        size: r.size,
        chunkSize: c.chunkSize,
        checksums: c.checksums[i],
        blob: c.digests[i],
        tensors: [...r.tensors ?? []]
      }))
    });
  }
  return Manifest.parse(
    {
      schemaVersion: 1,
      id: c.id,
      name: c.name,
      createdAt: (/* @__PURE__ */ new Date()).toISOString(),
      vsnapVersion: VERSION,
      checksumAlgorithm: "xxh3-128",
      engine: c.options.engine ?? null,
      model: c.options.model ?? null,
      platform: c.platform,
      ranks,
      expectedResponse: c.options.expectedResponse ?? null,
      labels: { ...c.options.labels ?? {} }
    },
    `manifest of '${c.name}'`
  );
}

// src/snapshot/snapshot.ts
function notDurable(snapshot, what) {
  return new VsnapError(
    "E_NOT_DURABLE",
    `capture ${snapshot.id} of '${snapshot.name}' (persist 'async' or 'off') is not in the store yet, so ${what} needs the RAM tier that holds it. Pass that HostCache, or call snapshot.persist() first.`,
    { name: snapshot.name, id: snapshot.id }
  );
}
var Snapshot = class _Snapshot {
  /** The store holding it. */
  store;
  /** Its manifest. */
  manifest;
  /** Timing of the capture that created this object (undefined for opened snapshots). */
  lastCapture;
  /** The RAM tier holding a capture the store does not have yet. */
  ramTier;
  isDurable;
  persisting;
  constructor(store, manifest, lastCapture, ramTier) {
    this.store = store;
    this.manifest = manifest;
    this.lastCapture = lastCapture;
    this.ramTier = ramTier;
    this.isDurable = ramTier === void 0;
  }
  /**
   * Whether the store holds this capture (a crash of this process cannot lose it). Always true
   * except after a capture with persist `async` (until written) or `off` (until
   * {@link Snapshot.persist}).
   */
  get durable() {
    return this.isDurable;
  }
  /**
   * Makes the capture durable: waits for the background persistence of an `async` capture, or
   * writes an `off` one (or retries a failed one) from the RAM tier now. Every chunk is hashed
   * again on its way to disk and must match the checksum taken when it landed in RAM. Resolves at
   * once for a durable snapshot. Throws E_NOT_DURABLE when the RAM tier no longer holds it.
   */
  async persist(options = {}) {
    if (this.isDurable) return;
    this.persisting ??= persistFromRamTier(this.store, this.manifest, this.ramTier, options).then(
      () => {
        this.isDurable = true;
      },
      (err) => {
        this.persisting = void 0;
        throw err;
      }
    );
    return this.persisting;
  }
  /** The snapshot's name. */
  get name() {
    return this.manifest.name;
  }
  /** This capture's id. */
  get id() {
    return this.manifest.id;
  }
  /** The snapshot of a manifest already read from `store`. @internal */
  static of(store, manifest) {
    return new _Snapshot(store, manifest);
  }
  /** The current capture of `name` (or the one with `id`). Throws E_SNAPSHOT_NOT_FOUND. */
  static async open(store, name, options = {}) {
    return new _Snapshot(store, await store.get(name, options.id));
  }
  /**
   * Captures regions into the store under `name`: every region is copied out in chunks,
   * checksummed while streaming, and written as a blob; the manifest is published last, and
   * `current` then names this capture. Identical regions are stored once. With a `cache`, the
   * bytes land in the RAM tier first, and `persist` says when the store gets them (a capture
   * persisted later becomes `current` only if no newer capture of `name` was published since).
   */
  static async capture(store, name, options) {
    validateName(name);
    checkCaptureRegions(options.regions);
    const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_SIZE;
    if (!Number.isSafeInteger(chunkSize) || chunkSize <= 0 || chunkSize % 4096 !== 0 || chunkSize > 2 ** 30) {
      invalidArgument("chunkSize", "a positive multiple of 4096 up to 1 GiB", chunkSize);
    }
    const regions = options.regions;
    const total = regions.reduce((s, r) => s + r.size, 0);
    const { platform, gpus } = await platformOf(regions);
    const persist = options.persist ?? "sync";
    if (persist !== "sync" && persist !== "async" && persist !== "off") invalidArgument("persist", "'sync', 'async' or 'off'", persist);
    const cache = options.cache;
    if (persist !== "sync" && !cache) invalidArgument("cache", `a HostCache: persist '${persist}' keeps the capture in the RAM tier`, cache);
    const items = regions.map((r) => ({ rank: r.rank ?? 0, key: r.key, size: r.size }));
    const id = store.newCaptureId();
    const txn = persist === "sync" ? await store.beginCapture(name, total, id) : void 0;
    let reservation;
    try {
      if (cache && (persist !== "sync" || cache.fits(items))) reservation = cache.reserve(name, id, items);
      const result = await runTransfer({
        op: "capture",
        label: name,
        regions: regions.map((r, i) => ({
          name: r.key,
          ...txn ? { blobPath: txn.blobTmpPath(i) } : {},
          size: r.size,
          chunkSize,
          memory: r.memory,
          ...reservation ? { hostCopy: { kind: "buffer", buffer: reservation.buffer, offset: reservation.offsets.get(`${items[i].rank}/${r.key}`) } } : {}
        })),
        ...passOn(options)
      });
      failpoint("capture.after-transfer");
      const checksums = result.checksums ?? [];
      const digests = regions.map((r, i) => blobDigest(r.size, chunkSize, checksums[i]));
      const manifest = captureManifest({ id, name, regions, chunkSize, checksums, digests, platform, gpus, options });
      let dedupedBytes = 0;
      if (txn) ({ dedupedBytes } = await txn.publish(manifest, regions.map((r, i) => ({ tmpPath: txn.blobTmpPath(i), size: r.size, digest: digests[i] }))));
      reservation?.commit(txn !== void 0);
      const seconds = result.seconds;
      const summary = { bytes: total, seconds, bytesPerSecond: total / Math.max(seconds, 1e-9), ...txn ? { dedupedBytes } : {} };
      const snapshot = new _Snapshot(store, manifest, summary, txn ? void 0 : cache);
      if (persist === "async") snapshot.persistInBackground(options);
      return snapshot;
    } catch (err) {
      reservation?.abandon();
      await txn?.abort();
      throw toVsnapError(err);
    }
  }
  /** Starts persisting an `async` capture; a failure is reported as a warning and left for persist() to retry. */
  persistInBackground(options) {
    this.persist(options.threads ? { threads: options.threads } : {}).catch((err) => {
      process.emitWarning(`persisting capture ${this.id} of '${this.name}' failed: ${err.message}. It stays in the RAM tier only; call snapshot.persist() to retry.`, {
        code: "VSNAP_PERSIST"
      });
    });
  }
  /**
   * Restores the snapshot into live regions: checks the layout (every region by rank and key,
   * sizes, tags, and any engine/model/platform facts given) and refuses with E_MANIFEST_MISMATCH
   * listing every difference; then streams each blob, verifying every chunk before it is copied.
   */
  async restore(options) {
    if (!Array.isArray(options?.regions)) invalidArgument("regions", "an array of restore targets", options?.regions);
    const byRank = [];
    for (const r of options.regions) {
      const rank = r.rank ?? 0;
      if (!Number.isInteger(rank) || rank < 0) invalidArgument("rank", "an integer >= 0", r.rank);
      while (byRank.length <= rank) byRank.push([]);
      byRank[rank].push({ key: r.key, size: r.size, ...r.tag !== void 0 ? { tag: r.tag } : {} });
    }
    this.manifest.assertCompatible({ ...options.live ?? {}, ranks: byRank.map((regions) => ({ regions })) });
    if (!this.isDurable && !options.cache?.has(this.id)) throw notDurable(this, "a restore");
    const targets = new Map(options.regions.map((r) => [`${r.rank ?? 0}/${r.key}`, r]));
    const verify = options.verify ?? "chunk";
    if (verify !== "chunk" && verify !== "all-first") invalidArgument("verify", "'chunk' or 'all-first'", verify);
    const common = {
      label: this.name,
      ...passOn(options)
    };
    if (options.cache?.fits(this.manifest)) {
      const started = performance.now();
      const wasHeld = options.cache.has(this.id);
      const lease = await options.cache.acquire(this.store, this.manifest, { ...common, directIo: options.directIo ?? false });
      try {
        const result2 = await runTransfer({
          ...common,
          op: "copy",
          regions: [...this.manifest.regions()].map(({ rank, region }) => ({
            name: region.key,
            size: region.size,
            chunkSize: region.chunkSize,
            hostCopy: { kind: "buffer", buffer: lease.buffer, offset: lease.offsets.get(`${rank}/${region.key}`) },
            memory: targets.get(`${rank}/${region.key}`).memory
          }))
        });
        const seconds = wasHeld ? result2.seconds : (performance.now() - started) / 1e3;
        return { bytes: result2.bytes, seconds, bytesPerSecond: result2.bytes / Math.max(seconds, 1e-9), tier: wasHeld ? "ram" : "store" };
      } finally {
        lease.release();
      }
    }
    const result = await this.store.withLock(
      false,
      () => runTransfer({
        ...common,
        op: "hydrate",
        verifyFirst: verify === "all-first",
        regions: [...this.manifest.regions()].map(({ rank, region }) => ({
          name: region.key,
          blobPath: this.store.blobPath(region.blob),
          size: region.size,
          chunkSize: region.chunkSize,
          checksums: region.checksums,
          memory: targets.get(`${rank}/${region.key}`).memory
        })),
        directIo: options.directIo ?? false
      })
    );
    return { bytes: result.bytes, seconds: result.seconds, bytesPerSecond: result.bytes / Math.max(result.seconds, 1e-9), tier: "store" };
  }
  /**
   * Captures a running engine's weights through its vsnap plugin: records a short greedy
   * completion (the expected response), has every worker export its weights regions, copies them
   * out per rank in parallel, and publishes the snapshot with the engine, model and platform facts.
   */
  static async captureEngine(store, name, client, options = {}) {
    return captureEngine(_Snapshot, store, name, client, options);
  }
  /**
   * Puts an engine to sleep (level 2, freeing its weights) only if this store's snapshot `name`
   * can bring them back: it must match the live layout and engine facts, with every blob
   * present. Otherwise it captures first (`captureIfNeeded`) or refuses with E_NOT_RESTORABLE:
   * weights that cannot come back are never discarded.
   */
  static async suspendEngine(store, name, client, options = {}) {
    return suspendEngine(_Snapshot, store, name, client, options);
  }
  /**
   * Whether the store's snapshot `name` could bring this engine's weights back (the check
   * {@link Snapshot.suspendEngine} makes before sleeping), and if not, why.
   */
  static async restorableFor(store, name, client, options = {}) {
    return restorableFor(_Snapshot, store, name, client, options);
  }
  /**
   * Restores this snapshot into a suspended engine: wakes the weights, has the workers export
   * them, checks the layout and facts, hydrates with every chunk verified, wakes the KV cache,
   * resets the prefix cache, and re-runs the expected response; only then does it resolve. Any
   * failure puts the engine back to sleep and says how to recover.
   */
  async restoreEngine(client, options = {}) {
    return restoreEngine(this, client, options);
  }
  /** Re-hashes every blob of this capture; see {@link RegionStore.verify}. */
  async verify(options = {}) {
    if (!this.isDurable) throw notDurable(this, "verifying its blobs");
    return this.store.verify(this.name, { ...options, id: this.id });
  }
};
export {
  HostRegion,
  RegionStore,
  Snapshot
};
