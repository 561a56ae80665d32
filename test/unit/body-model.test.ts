import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { modelOf } from '../../src/serve/body-model.js';

const of = (text: string): string => modelOf(Buffer.from(text));
const code = (text: string): string | undefined => {
  try {
    of(text);
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
};

describe('the model of a request body, read without parsing the rest', () => {
  it('agrees with JSON.parse on any JSON object (the last model key wins; nested ones are not it)', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.jsonValue()), fc.string(), fc.boolean(), (rest, model, nest) => {
        const body = { ...rest, ...(nest ? { inner: { model: 'not-this' } } : {}), model };
        const text = JSON.stringify(body, null, nest ? 2 : undefined);
        expect(of(text)).toBe((JSON.parse(text) as { model: string }).model);
      }),
      { numRuns: 2000 },
    );
  });

  it('escapes, non-ASCII and a huge prompt before the model', () => {
    expect(of('{"prompt":"a\\\\\\"}{[","model":"m\\u00e9\\"x"}')).toBe('mé"x');
    expect(of(`{"prompt":"${'x'.repeat(5_000_000)}","model":"big"}`)).toBe('big');
    expect(of(' \n{ "model" : "spaced" } \n')).toBe('spaced');
  });

  it('not JSON, not an object, or no model string: E_INVALID_ARGUMENT with the reason', () => {
    for (const t of ['', '{', '{"model":"m",}', '{"model":"m"} x', '{"x":tru,"model":"m"}', '{"a":[1,2}', '{"model":"m"']) expect(code(t), t).toBe('the body is not JSON');
    for (const t of ['[]', 'null', '{}', '{"model":1}', '{"model":null}', '{"x":"model"}']) expect(code(t), t).toBe('the body needs a "model" string');
  });
});
