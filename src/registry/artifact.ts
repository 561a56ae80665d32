import { createHash } from 'node:crypto';

import { VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import { storedBytes } from '../store/coded-blob.js';

/** The OCI image manifest media type (image-spec manifest.md). @internal */
export const OCI_MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
/** A vsnap snapshot's artifactType (image-spec: "the type of an artifact when the manifest is used for an artifact"). @public */
export const SNAPSHOT_ARTIFACT_TYPE = 'application/vnd.vsnap.snapshot.v1+json';
/** The config blob: the vsnap manifest JSON, chunk checksums included. @internal */
export const CONFIG_MEDIA_TYPE = 'application/vnd.vsnap.snapshot.config.v1+json';
/** One layer per region blob: the region's raw bytes. @internal */
export const REGION_MEDIA_TYPE = 'application/vnd.vsnap.region.v1';
/** A region blob stored coded (docs/compression.md): its vsnap-c1 chunks back to back. @internal */
export const REGION_CODED_MEDIA_TYPE = 'application/vnd.vsnap.region.vsnap-c1.v1';

/** Annotation keys (reverse-DNS of the project, as the image spec asks). @internal */
export const ANNOTATION = {
  rank: 'dev.vsnap.region.rank',
  key: 'dev.vsnap.region.key',
  blob: 'dev.vsnap.region.blob',
  name: 'dev.vsnap.snapshot.name',
  id: 'dev.vsnap.snapshot.id',
  created: 'org.opencontainers.image.created',
} as const;

/** An OCI content descriptor. @internal */
export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
}

/** The OCI image manifest of a snapshot. @internal */
export interface SnapshotArtifact {
  schemaVersion: 2;
  mediaType: typeof OCI_MANIFEST;
  artifactType: typeof SNAPSHOT_ARTIFACT_TYPE;
  config: Descriptor;
  layers: Descriptor[];
  annotations: Record<string, string>;
}

/** `sha256:<hex>` of bytes. @internal */
export function sha256Digest(data: Uint8Array | string): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

/** The config blob of a snapshot: its manifest's JSON. @internal */
export function configBlob(manifest: Manifest): Buffer {
  return Buffer.from(JSON.stringify(manifest.toJSON()));
}

/**
 * The OCI manifest: the config blob, then one layer per distinct region blob (in manifest
 * order; a blob shared by regions is one layer, annotated with its first region).
 * `layerDigests` maps the store digest to the sha256 of the blob's content.
 * @internal
 */
export function buildArtifact(manifest: Manifest, config: Buffer, layerDigests: ReadonlyMap<string, string>): SnapshotArtifact {
  const layers: Descriptor[] = [];
  const seen = new Set<string>();
  for (const { rank, region } of manifest.regions()) {
    if (seen.has(region.blob)) continue;
    seen.add(region.blob);
    const digest = layerDigests.get(region.blob);
    if (!digest) throw new VsnapError('E_INTERNAL', `no content digest for blob ${region.blob}`);
    layers.push({
      mediaType: region.codec ? REGION_CODED_MEDIA_TYPE : REGION_MEDIA_TYPE,
      digest,
      size: storedBytes(region),
      annotations: { [ANNOTATION.rank]: String(rank), [ANNOTATION.key]: region.key, [ANNOTATION.blob]: region.blob },
    });
  }
  return {
    schemaVersion: 2,
    mediaType: OCI_MANIFEST,
    artifactType: SNAPSHOT_ARTIFACT_TYPE,
    config: { mediaType: CONFIG_MEDIA_TYPE, digest: sha256Digest(config), size: config.length },
    layers,
    annotations: { [ANNOTATION.name]: manifest.name, [ANNOTATION.id]: manifest.id, [ANNOTATION.created]: manifest.data.createdAt },
  };
}

const SHA = /^sha256:[a-f0-9]{64}$/;

/** Reads an OCI manifest fetched from a registry, refusing anything that is not a vsnap snapshot. @internal */
export function parseArtifact(text: string, where: string): SnapshotArtifact {
  const bad = (why: string): never => {
    throw new VsnapError('E_REGISTRY', `${where} is not a vsnap snapshot (${why}); push it with \`vsnap push\``, { reference: where });
  };
  let v: Partial<SnapshotArtifact>;
  try {
    v = JSON.parse(text) as Partial<SnapshotArtifact>;
  } catch {
    return bad('the manifest is not JSON');
  }
  if (v.mediaType !== undefined && v.mediaType !== OCI_MANIFEST) bad(`media type ${String(v.mediaType)}`);
  if (v.artifactType !== SNAPSHOT_ARTIFACT_TYPE && v.config?.mediaType !== CONFIG_MEDIA_TYPE) bad(`artifactType ${String(v.artifactType)}`);
  const descriptor = (d: Partial<Descriptor> | undefined, what: string): Descriptor => {
    if (!d || typeof d.digest !== 'string' || !SHA.test(d.digest) || !Number.isSafeInteger(d.size) || (d.size as number) < 0) bad(`${what} is not a sha256 descriptor`);
    return d as Descriptor;
  };
  const config = descriptor(v.config, 'config');
  if (!Array.isArray(v.layers)) bad('no layers');
  const layers = v.layers!.map((l, i) => descriptor(l, `layers[${i}]`));
  return { schemaVersion: 2, mediaType: OCI_MANIFEST, artifactType: SNAPSHOT_ARTIFACT_TYPE, config, layers, annotations: v.annotations ?? {} };
}
