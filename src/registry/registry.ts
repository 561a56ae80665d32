import { abortError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import { validateName } from '../store/names.js';
import type { RegionStore } from '../store/region-store.js';
import { Snapshot } from '../snapshot/snapshot.js';
import { SNAPSHOT_ARTIFACT_TYPE } from './artifact.js';
import { OciHttp } from './http.js';
import { checkCompatible, pullInto, resolveArtifact } from './pull.js';
import { pushManifest } from './push.js';
import { formatReference, parseReference } from './reference.js';
import { PushState } from './state.js';
import type { RegistryReference } from './reference.js';
import type { PullOptions, PullReport, PushOptions, PushReport, RegistryOptions } from './types.js';

const MiB = 1024 * 1024;

/**
 * Snapshots as OCI artifacts in any OCI registry (distribution, Harbor, Zot, GHCR, ECR, ...).
 * A snapshot is an OCI image manifest with `artifactType`
 * `application/vnd.vsnap.snapshot.v1+json`; its config blob is the vsnap manifest (chunk
 * checksums included), and each distinct region blob is one layer (sha256 of its content),
 * annotated with the region's rank, key and store digest.
 *
 * Credentials come from the options, else the Docker config file; anonymous, basic and bearer
 * token auth are answered as the registry's `WWW-Authenticate` asks.
 *
 * @example
 * ```ts
 * const registry = new RegistryClient();
 * await registry.push(store, 'llama-8b', 'registry.example.com/team/llama-8b:v1');
 * // on another machine
 * await registry.pull(store, 'registry.example.com/team/llama-8b:v1', { live: { platform: { gpuName: 'NVIDIA H200' } } });
 * ```
 * @public
 */
export class RegistryClient {
  /** The artifact type of a vsnap snapshot in an OCI registry (its image manifest's `artifactType`). */
  static readonly ARTIFACT_TYPE: 'application/vnd.vsnap.snapshot.v1+json' = SNAPSHOT_ARTIFACT_TYPE;

  /** Parses a reference `<registry>/<repository>[:<tag> | @<digest>]` (E_INVALID_ARGUMENT when it is not one). */
  static parseReference(text: string): RegistryReference {
    return parseReference(text);
  }

  private readonly options: RegistryOptions;
  private readonly state: PushState;

  constructor(options: RegistryOptions = {}) {
    for (const key of ['chunkBytes', 'rangeMinBytes', 'connections', 'maxBufferedBytes'] as const) {
      const v = options[key];
      if (v !== undefined && (!Number.isSafeInteger(v) || v <= 0)) {
        throw new VsnapError('E_INVALID_ARGUMENT', `${key} must be a positive integer, got ${JSON.stringify(v)}`, { name: key });
      }
    }
    for (const key of ['stallMs', 'graceMs', 'minBytesPerSecond'] as const) {
      const v = options.timeouts?.[key];
      if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)) {
        throw new VsnapError('E_INVALID_ARGUMENT', `timeouts.${key} must be a positive number, got ${JSON.stringify(v)}`, { name: `timeouts.${key}` });
      }
    }
    this.options = options;
    this.state = new PushState(options.stateDir);
  }

  /**
   * Pushes snapshot `name` of `store` (its current capture, or `options.id`) to `reference`
   * (`<registry>/<repo>:<tag>`). Blobs the registry has are not sent; the rest go in parallel,
   * and an upload interrupted earlier resumes where the registry's copy stops.
   */
  async push(store: RegionStore, name: string, reference: string, options: PushOptions = {}): Promise<PushReport> {
    validateName(name);
    const started = performance.now();
    const ref = parseReference(reference);
    if (ref.reference.startsWith('sha256:')) throw new VsnapError('E_INVALID_ARGUMENT', `push needs a tag, not a digest: ${reference}`, { reference });
    const manifest = await store.get(name, options.id);
    const http = new OciHttp(ref, 'pull,push', this.options);
    try {
      const r = await pushManifest(store, manifest, ref.reference, {
        http,
        state: this.state,
        chunkBytes: this.options.chunkBytes ?? 64 * MiB,
        connections: this.options.connections ?? 4,
        mountFrom: options.mountFrom,
        signal: options.signal,
        onProgress: options.onProgress,
      });
      return { reference: formatReference(ref), ...r, seconds: (performance.now() - started) / 1000 };
    } catch (err) {
      if (options.signal?.aborted) throw abortError(options.signal, 'the push');
      throw err;
    } finally {
      await http.close();
    }
  }

  /**
   * The vsnap manifest of a pushed snapshot, fetched without any layer (the OCI manifest and
   * the config blob only, both digests checked).
   */
  async inspect(reference: string, options: { signal?: AbortSignal } = {}): Promise<{ digest: string; manifest: Manifest }> {
    const http = new OciHttp(parseReference(reference), 'pull', this.options);
    try {
      const { digest, manifest } = await resolveArtifact(http, options.signal);
      return { digest, manifest };
    } finally {
      await http.close();
    }
  }

  /**
   * Pulls `reference` into `store`: the manifest and config first; with `options.live`, a
   * snapshot that does not fit is refused (E_MANIFEST_MISMATCH) before any layer is fetched.
   * Then the blobs the store lacks, in parallel (large ones over several Range requests), each
   * chunk checked against its checksum as it arrives; a damaged layer (E_CHECKSUM) leaves
   * nothing in the store. Published through the store's own crash-safe path.
   */
  async pull(store: RegionStore, reference: string, options: PullOptions = {}): Promise<PullReport> {
    const started = performance.now();
    const ref = parseReference(reference);
    if (options.name !== undefined) validateName(options.name);
    const http = new OciHttp(ref, 'pull', this.options);
    try {
      const resolved = await resolveArtifact(http, options.signal);
      if (options.live) checkCompatible(resolved.manifest, options.live);
      const name = options.name ?? resolved.manifest.name;
      const r = await pullInto(store, resolved, name, {
        http,
        connections: this.options.connections ?? 4,
        rangeMinBytes: this.options.rangeMinBytes ?? 256 * MiB,
        maxBufferedBytes: this.options.maxBufferedBytes ?? 256 * MiB,
        signal: options.signal,
        onProgress: options.onProgress,
      });
      return {
        name,
        id: r.manifest.id,
        digest: resolved.digest,
        bytes: r.manifest.totalBytes,
        bytesDownloaded: r.bytesDownloaded,
        bytesSkipped: r.bytesSkipped,
        seconds: (performance.now() - started) / 1000,
      };
    } finally {
      await http.close();
    }
  }

  /**
   * A registry reference as a snapshot source: pulled into `store` on first use, then opened
   * from the store with no network (pass `refresh` to pull again; only blobs the store lacks
   * move). The local name is `options.name`, else the repository's last component and the tag
   * (`team/llama-8b:v1` gives `llama-8b-v1`; a digest gives its first 12 hex digits). Use the
   * result with `restoreEngine` or `Snapshot.restore` as any local snapshot.
   */
  async openSnapshot(store: RegionStore, reference: string, options: PullOptions & { refresh?: boolean } = {}): Promise<Snapshot> {
    const name = options.name ?? localName(parseReference(reference));
    validateName(name);
    if (options.refresh || !(await store.current(name))) await this.pull(store, reference, { ...options, name });
    return Snapshot.open(store, name);
  }
}

/** The store name a reference is pulled under by default. @internal */
export function localName(ref: RegistryReference): string {
  const last = ref.repository.split('/').pop()!;
  const tag = ref.reference.startsWith('sha256:') ? ref.reference.slice(7, 19) : ref.reference;
  return `${last}-${tag}`.slice(0, 128);
}
