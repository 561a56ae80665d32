import { VsnapError } from '../errors.js';

/**
 * A parsed registry reference: `[http://]host[:port]/repo/path[:tag|@sha256:...]`.
 * @public
 */
export interface RegistryReference {
  /** `https:` (default) or `http:` when the reference starts with `http://` (a plain registry). */
  readonly scheme: 'https:' | 'http:';
  /** host[:port] as written. */
  readonly host: string;
  /** The repository path, e.g. `team/llama-8b`. */
  readonly repository: string;
  /** The tag or digest (`sha256:...`); `latest` when neither was given. */
  readonly reference: string;
}

// The distribution spec's grammar: path components of lowercase alphanumerics and separators.
const REPO = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const DIGEST = /^sha256:[a-f0-9]{64}$/;

/**
 * Parses `<registry>/<repo>[:<tag>|@<digest>]`. The registry host is required (vsnap never
 * guesses Docker Hub): it is the first component, and it must contain a `.` or a `:` or be
 * `localhost`. Throws E_INVALID_ARGUMENT saying what is wrong.
 * @public
 */
export function parseReference(text: string): RegistryReference {
  const bad = (why: string): never => {
    throw new VsnapError('E_INVALID_ARGUMENT', `${JSON.stringify(text)} is not a registry reference (${why}); write <registry>/<repo>:<tag>, e.g. registry.example.com:5000/team/llama-8b:v1`, {
      reference: text,
    });
  };
  if (typeof text !== 'string' || text.length === 0) bad('empty');
  let rest = text;
  let scheme: 'https:' | 'http:' = 'https:';
  if (rest.startsWith('http://')) {
    scheme = 'http:';
    rest = rest.slice(7);
  } else if (rest.startsWith('https://')) rest = rest.slice(8);
  const slash = rest.indexOf('/');
  if (slash <= 0) bad('no registry host');
  const host = rest.slice(0, slash);
  if (!(host.includes('.') || host.includes(':') || host === 'localhost')) bad(`"${host}" does not look like a registry host`);
  let path = rest.slice(slash + 1);
  let reference = 'latest';
  const at = path.indexOf('@');
  if (at >= 0) {
    reference = path.slice(at + 1);
    path = path.slice(0, at);
    if (!DIGEST.test(reference)) bad(`"${reference}" is not a sha256 digest`);
  } else {
    const colon = path.lastIndexOf(':');
    if (colon >= 0) {
      reference = path.slice(colon + 1);
      path = path.slice(0, colon);
      if (!TAG.test(reference)) bad(`"${reference}" is not a valid tag`);
    }
  }
  if (!REPO.test(path)) bad(`"${path}" is not a valid repository name (lowercase letters, digits, separators)`);
  return { scheme, host, repository: path, reference };
}

/**
 * Why `text` is not a registry reference, or undefined when it is one (as {@link parseReference}
 * reads it). Pure: for validating configuration and command-line arguments without a throw.
 * @internal
 */
export function validateReference(text: unknown): string | undefined {
  if (typeof text !== 'string') return `a registry reference must be a string, got ${text === null ? 'null' : typeof text}`;
  try {
    parseReference(text);
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}

/** The reference written back. @internal */
export function formatReference(ref: RegistryReference): string {
  const sep = ref.reference.startsWith('sha256:') ? '@' : ':';
  return `${ref.scheme === 'http:' ? 'http://' : ''}${ref.host}/${ref.repository}${sep}${ref.reference}`;
}
