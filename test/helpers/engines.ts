// Reference engines for one vitest file: started with a client each, both closed after every
// test (vitest only: the GPU suites, on Node's runner, use test/helpers/engine.ts directly).
import { afterEach } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { FaultyClient } from './faults.js';
import { askCapital, startEngine, type EngineOptions, type TestEngine } from './engine.js';

/** Registers the cleanup; `engine()` starts one with its client, `track()` adds any other to stop. */
export function useEngines() {
  const running: Array<TestEngine | EngineClient> = [];
  afterEach(async () => {
    for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
  });
  return {
    async engine(options: EngineOptions = {}) {
      const e = await startEngine(options);
      // A FaultyClient injects nothing until told to: a test may make a call fail, wait, or read as an older plugin's.
      const client = new FaultyClient({ baseUrl: e.url, token: e.token });
      running.push(e, client);
      return { e, client };
    },
    track(x: TestEngine | EngineClient) {
      running.push(x);
    },
  };
}

/** The token ids of the reference answer (8 tokens of the capital prompt). */
export const ask = async (client: EngineClient) => (await askCapital(client, 8)).ids;
