import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { parseArtifact, SNAPSHOT_ARTIFACT_TYPE } from '../../src/registry/artifact.js';
import { dockerConfigCredentials, parseChallenge } from '../../src/registry/auth.js';
import { formatReference, parseReference, validateReference } from '../../src/registry/reference.js';
import { tempDir } from '../helpers/tmp.js';

describe('registry references', () => {
  it('parses host, port, nested repository, tag and digest', () => {
    expect(parseReference('registry.example.com:5000/team/llama-8b:v1')).toEqual({ scheme: 'https:', host: 'registry.example.com:5000', repository: 'team/llama-8b', reference: 'v1' });
    expect(parseReference('localhost/m')).toMatchObject({ host: 'localhost', repository: 'm', reference: 'latest' });
    expect(parseReference('http://127.0.0.1:5000/a/b')).toMatchObject({ scheme: 'http:', host: '127.0.0.1:5000', reference: 'latest' });
    const d = `sha256:${'a'.repeat(64)}`;
    expect(parseReference(`ghcr.io/o/r@${d}`).reference).toBe(d);
    expect(formatReference(parseReference(`ghcr.io/o/r@${d}`))).toBe(`ghcr.io/o/r@${d}`);
  });

  it.each(['', 'llama:v1', 'team/llama:v1', 'host.io/', 'host.io/UPPER:v1', 'host.io/a:bad tag', 'host.io/a@sha256:12'])('refuses %j with E_INVALID_ARGUMENT', (ref) => {
    expect(() => parseReference(ref)).toThrow(VsnapError);
    try {
      parseReference(ref);
    } catch (err) {
      expect((err as VsnapError).code).toBe('E_INVALID_ARGUMENT');
      expect((err as VsnapError).message).toMatch(/<registry>\/<repo>:<tag>/);
    }
  });
});

describe('validateReference', () => {
  it('gives the reason a reference is malformed, or undefined, without throwing', () => {
    expect(validateReference('registry.example.com:5000/team/llama-8b:v1')).toBeUndefined();
    expect(validateReference('http://127.0.0.1:5000/a/b@sha256:' + 'a'.repeat(64))).toBeUndefined();
    expect(validateReference('nosuch')).toMatch(/"nosuch" is not a registry reference \(no registry host\).*<registry>\/<repo>:<tag>/);
    expect(validateReference('host.io/UPPER:v1')).toMatch(/not a valid repository name/);
    expect(validateReference(42)).toMatch(/must be a string, got number/);
    expect(validateReference(null)).toMatch(/got null/);
  });
});

describe('WWW-Authenticate', () => {
  it('parses a bearer challenge with quoted, commas-in-quotes and bare values', () => {
    expect(parseChallenge('Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push"')).toEqual({
      scheme: 'bearer',
      params: { realm: 'https://auth.example.com/token', service: 'registry.example.com', scope: 'repository:a/b:pull,push' },
    });
    expect(parseChallenge('Basic realm=basic-realm')).toEqual({ scheme: 'basic', params: { realm: 'basic-realm' } });
    expect(parseChallenge(undefined)).toBeUndefined();
  });
});

describe('Docker config credentials', () => {
  it('reads auths.<host>.auth (base64 user:password), the https:// key form, and username/password', () => {
    const dir = tempDir();
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({
        auths: {
          'r1.example.com': { auth: Buffer.from('alice:pa:ss').toString('base64') },
          'https://r2.example.com': { auth: Buffer.from('bob:x').toString('base64') },
          'r3.example.com': { username: 'carol', password: 'y' },
        },
      }),
    );
    const env = { DOCKER_CONFIG: dir };
    expect(dockerConfigCredentials('r1.example.com', env)).toEqual({ username: 'alice', password: 'pa:ss' });
    expect(dockerConfigCredentials('r2.example.com', env)).toEqual({ username: 'bob', password: 'x' });
    expect(dockerConfigCredentials('r3.example.com', env)).toEqual({ username: 'carol', password: 'y' });
    expect(dockerConfigCredentials('other.example.com', env)).toBeUndefined();
    expect(dockerConfigCredentials('r1.example.com', { DOCKER_CONFIG: join(dir, 'none') })).toBeUndefined();
    writeFileSync(join(dir, 'config.json'), '{not json');
    expect(() => dockerConfigCredentials('r1.example.com', env)).toThrow(/not valid JSON/);
  });
});

describe('artifact manifests', () => {
  const sha = `sha256:${'b'.repeat(64)}`;
  it('accepts a vsnap artifact and refuses an ordinary image or a malformed descriptor', () => {
    const ok = { schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', artifactType: SNAPSHOT_ARTIFACT_TYPE, config: { mediaType: 'x', digest: sha, size: 3 }, layers: [] };
    expect(parseArtifact(JSON.stringify(ok), 'r').config.digest).toBe(sha);
    const image = { ...ok, artifactType: undefined, config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha, size: 3 } };
    expect(() => parseArtifact(JSON.stringify(image), 'r')).toThrow(/not a vsnap snapshot/);
    expect(() => parseArtifact(JSON.stringify({ ...ok, layers: [{ digest: 'md5:1', size: 1 }] }), 'r')).toThrow(/layers\[0\]/);
    expect(() => parseArtifact('<html>', 'r')).toThrow(/not JSON/);
  });
});
