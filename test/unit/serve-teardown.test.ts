import { describe, expect, it } from 'vitest';

import { Teardown } from '../../src/serve/teardown.js';

describe("serve's one teardown path", () => {
  it('stops the parts last started first, once, and a failing stop does not keep the rest from running', async () => {
    const log: string[] = [];
    const order: string[] = [];
    const t = new Teardown((l) => log.push(l));
    t.add('record', () => void order.push('record'));
    t.add('engines', async () => {
      await Promise.resolve();
      order.push('engines');
      throw new Error('SIGKILL refused');
    });
    t.add('agent', () => void order.push('agent'));
    const [a, b] = [t.run(), t.run()];
    expect(a).toBe(b);
    await a;
    await t.run();
    expect(order).toEqual(['agent', 'engines', 'record']);
    expect(log).toEqual(['vsnap: stopping engines failed: SIGKILL refused']);
    expect(() => t.add('late', () => undefined)).toThrow(/stopping/);
  });
});
