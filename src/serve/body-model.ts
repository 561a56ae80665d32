import { VsnapError } from '../errors.js';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * The `model` of a JSON request body, read without parsing the rest: a 31 MiB prompt is skipped
 * in place, never made into a string (parsing it whole makes two copies the size of the body,
 * which the body budget does not count). The body's structure is checked on the way (an object,
 * keys, colons, commas, strings and nesting); the engine checks the values. The last `model` key
 * wins, as with `JSON.parse`. Throws E_INVALID_ARGUMENT when the body is not a JSON object or has
 * no `model` string.
 * @internal
 */
export function modelOf(body: Buffer): string {
  const notJson = (): VsnapError => new VsnapError('E_INVALID_ARGUMENT', 'the body is not JSON');
  let i = skipSpace(body, 0);
  if (body[i] !== 0x7b) {
    // not an object: valid JSON of another kind, or not JSON at all
    if (i < body.length && isJson(body)) throw new VsnapError('E_INVALID_ARGUMENT', 'the body needs a "model" string');
    throw notJson();
  }
  let model: string | undefined;
  let sawModel = false;
  i = skipSpace(body, i + 1);
  if (body[i] === 0x7d) i++;
  else {
    for (;;) {
      if (body[i] !== QUOTE) throw notJson();
      const keyEnd = stringEnd(body, i);
      if (keyEnd < 0) throw notJson();
      const isModel = keyEnd - i === 6 && body.toString('latin1', i + 1, keyEnd) === 'model';
      i = skipSpace(body, keyEnd + 1);
      if (body[i] !== 0x3a) throw notJson();
      i = skipSpace(body, i + 1);
      const end = valueEnd(body, i);
      if (end < 0) throw notJson();
      if (isModel) {
        sawModel = true;
        model = body[i] === QUOTE ? (JSON.parse(body.toString('utf8', i, end)) as string) : undefined;
      }
      i = skipSpace(body, end);
      if (body[i] === 0x2c) {
        i = skipSpace(body, i + 1);
        continue;
      }
      if (body[i] === 0x7d) {
        i++;
        break;
      }
      throw notJson();
    }
  }
  if (skipSpace(body, i) !== body.length) throw notJson();
  if (!sawModel || model === undefined) throw new VsnapError('E_INVALID_ARGUMENT', 'the body needs a "model" string');
  return model;
}

function isJson(body: Buffer): boolean {
  try {
    JSON.parse(body.toString('utf8'));
    return true;
  } catch {
    return false;
  }
}

function skipSpace(b: Buffer, i: number): number {
  while (i < b.length && (b[i] === 0x20 || b[i] === 0x0a || b[i] === 0x0d || b[i] === 0x09)) i++;
  return i;
}

/** The index of the closing quote of the string opening at `i`, or -1. */
function stringEnd(b: Buffer, i: number): number {
  let at = i + 1;
  for (;;) {
    const q = b.indexOf(QUOTE, at);
    if (q < 0) return -1;
    let slashes = 0;
    for (let k = q - 1; k > i && b[k] === BACKSLASH; k--) slashes++;
    if (slashes % 2 === 0) {
      return q;
    }
    at = q + 1;
  }
}

/** The index just past the value starting at `i` (string, object, array or literal), or -1. */
function valueEnd(b: Buffer, i: number): number {
  const c = b[i];
  if (c === undefined) return -1;
  if (c === QUOTE) {
    const e = stringEnd(b, i);
    return e < 0 ? -1 : e + 1;
  }
  if (c === 0x7b || c === 0x5b) {
    const stack: number[] = [c === 0x7b ? 0x7d : 0x5d];
    let k = i + 1;
    while (stack.length > 0) {
      if (k >= b.length) return -1;
      const d = b[k]!;
      if (d === QUOTE) {
        const e = stringEnd(b, k);
        if (e < 0) return -1;
        k = e + 1;
        continue;
      }
      if (d === 0x7b) stack.push(0x7d);
      else if (d === 0x5b) stack.push(0x5d);
      else if (d === 0x7d || d === 0x5d) {
        if (stack.pop() !== d) return -1;
      }
      k++;
    }
    return k;
  }
  // a number or a literal: up to the next delimiter
  let k = i;
  while (k < b.length && b[k] !== 0x2c && b[k] !== 0x7d && b[k] !== 0x5d && b[k] !== 0x20 && b[k] !== 0x0a && b[k] !== 0x0d && b[k] !== 0x09) k++;
  if (k === i) return -1;
  const word = b.toString('latin1', i, k);
  if (!/^(true|false|null|-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?)$/.test(word)) return -1;
  return k;
}
