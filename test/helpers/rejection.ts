import { expect } from 'vitest';

import { VsnapError } from '../../src/errors.js';

/** The VsnapError `p` rejects with (the test fails when it resolves or rejects with anything else). */
export async function rejection(p: Promise<unknown>): Promise<VsnapError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(VsnapError);
  return err as VsnapError;
}
