import { createHash } from 'node:crypto';
import { readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

import { mkdirParents } from '../store/fsutil.js';

/**
 * What a push remembers between runs, under one directory (default
 * `$XDG_CACHE_HOME/vsnap/registry`): the sha256 of each store blob (a store digest names
 * its content for good, so the hash is computed once), and the upload URL of each blob upload
 * in progress, so an interrupted push resumes where the registry's upload stands. Losing this
 * directory costs a re-hash and a restarted upload, never correctness.
 * @internal
 */
export class PushState {
  constructor(readonly dir: string = defaultStateDir()) {}

  /** The cached `sha256:...` of a store blob. */
  contentDigest(storeDigest: string): string | undefined {
    const text = this.read(join(this.dir, 'sha256', storeDigest));
    return text && /^sha256:[a-f0-9]{64}$/.test(text.trim()) ? text.trim() : undefined;
  }

  rememberContentDigest(storeDigest: string, digest: string): void {
    this.write(join(this.dir, 'sha256'), storeDigest, digest);
  }

  /** The upload URL saved for this blob in this repository, if an upload was left unfinished. */
  upload(origin: string, repository: string, digest: string): string | undefined {
    const text = this.read(join(this.dir, 'uploads', uploadKey(origin, repository, digest)));
    if (!text) return undefined;
    try {
      const v = JSON.parse(text) as { location?: unknown };
      return typeof v.location === 'string' ? v.location : undefined;
    } catch {
      return undefined;
    }
  }

  rememberUpload(origin: string, repository: string, digest: string, location: string): void {
    this.write(join(this.dir, 'uploads'), uploadKey(origin, repository, digest), JSON.stringify({ location }));
  }

  forgetUpload(origin: string, repository: string, digest: string): void {
    rmSync(join(this.dir, 'uploads', uploadKey(origin, repository, digest)), { force: true });
  }

  private read(path: string): string | undefined {
    try {
      return readFileSync(path, 'utf8');
    } catch {
      return undefined;
    }
  }

  /** Atomic replace (a crash leaves the old value or the new one). */
  private write(dir: string, file: string, text: string): void {
    mkdirParents(dir, 0o700);
    const tmp = join(dir, `.${file}.${process.pid}.tmp`);
    writeFileSync(tmp, text, { mode: 0o600 });
    renameSync(tmp, join(dir, file));
  }
}

function uploadKey(origin: string, repository: string, digest: string): string {
  return createHash('sha256').update(`${origin}\n${repository}\n${digest}`).digest('hex');
}

function defaultStateDir(): string {
  return join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'vsnap', 'registry');
}
