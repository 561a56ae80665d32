// vsnap serve against clients that starve the body budget and against its own death: a good
// client's completions are all served while 8 connections hold request bodies open, and after a
// SIGKILL of serve (booted, or in the middle of its boot) a restart with the same configuration
// serves, with no engine process of the killed serve left running.
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { request } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapAgent } from '../../src/serve/agent.js';
import { SwapController } from '../../src/swap/controller.js';
import { startEngine } from '../helpers/engine.js';
import { groupMembers, recordedEngines, referenceServeConfig, startServe, until } from '../helpers/serve-process.js';
import { FULL, prng, record, SEED } from './figures.js';

const GOOD = FULL ? 500 : 40;
const TRIALS = FULL ? 10 : 2;
const figures: Record<string, unknown> = { seed: SEED };

afterAll(() => {
  if (figures.starvation && figures.restarts) record('serve', figures);
});

describe('vsnap serve: starving clients and deaths of serve', () => {
  it(`${GOOD} completions of a good client while 8 connections hold 32 MiB bodies open: every one served`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'vsnap-rel-serve-'));
    const engine = await startEngine({ seed: 1, model: 'm' });
    const client = new EngineClient({ baseUrl: engine.url, token: engine.token });
    const store = await RegionStore.open(dir);
    const controller = await SwapController.create({ store, engines: [{ name: 'm', client, memoryBytes: 1e9 }], budgets: { 0: 2e9 } });
    const agent = await SwapAgent.listen({ controller, store }); // the defaults: 32 MiB a body, 256 MiB in flight
    const attackers: Socket[] = [];
    let trickle: NodeJS.Timeout | undefined;
    let served = 0;
    const refused: Record<string, number> = {};
    try {
      const { port } = new URL(agent.url);
      for (let i = 0; i < 8; i++) {
        const s = connect(Number(port), '127.0.0.1');
        s.on('error', () => undefined);
        s.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${32 * 1024 * 1024}\r\n\r\n{`);
        attackers.push(s);
      }
      await until(() => agent.bodyReads().requests === 8);
      // half of them then send a byte at a time (never finishing), half stay silent
      trickle = setInterval(() => attackers.slice(0, 4).forEach((s) => s.write(' ')), 20);
      for (let i = 0; i < GOOD; i++) {
        const r = await request(`${agent.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', prompt: 'The capital of France is', max_tokens: 2 }) });
        const text = await r.body.text();
        if (r.statusCode === 200) served++;
        else refused[String(r.statusCode)] = (refused[String(r.statusCode)] ?? 0) + 1;
        void text;
      }
      figures.starvation = { attackers: 8, declaredBytes: 32 * 1024 * 1024, good: GOOD, served, refused, attackersStillOpen: agent.bodyReads().requests };
    } finally {
      clearInterval(trickle);
      for (const s of attackers) s.destroy();
      await agent.close();
      controller.close();
      await client.close();
      await engine.stop();
      rmSync(dir, { recursive: true, force: true });
    }
    expect(served).toBe(GOOD);
  });

  it(`SIGKILL of serve, ${TRIALS} trials (booted, or mid-boot at a seeded engine), then a restart: every restart serves, no engine left behind`, async () => {
    const random = prng(SEED);
    let succeeded = 0;
    let leftBehind = 0;
    let duringBoot = 0;
    let leftAfterStop = 0;
    const failures: string[] = [];
    for (let t = 0; t < TRIALS; t++) {
      const dir = mkdtempSync(join(tmpdir(), 'vsnap-rel-serve-kill-'));
      const { file } = await referenceServeConfig(dir, 2);
      // every other trial kills it during the boot: once the first or the second engine (seeded) is recorded
      const mid = t % 2 === 1;
      const engineRecorded = random() < 0.5 ? 1 : 2;
      if (mid) duringBoot++;
      const first = startServe(file, dir);
      const pids = (s: { log(): string }) => [...s.log().matchAll(/engine process (\d+) started/g)].map((m) => Number(m[1]));
      let second: ReturnType<typeof startServe> | undefined;
      try {
        if (mid) await until(() => recordedEngines(dir).length >= engineRecorded || /serving m1, m2/.test(first.log()) || first.child.exitCode !== null);
        else await first.waitFor(/serving m1, m2/);
        first.child.kill('SIGKILL');
        await first.exited;
        const killed = pids(first);
        second = startServe(file, dir);
        try {
          await second.waitFor(/serving m1, m2/);
          succeeded++;
        } catch (err) {
          failures.push(`trial ${t}: ${(err as Error).message.slice(0, 400)}`);
        }
        leftBehind += killed.reduce((n, pid) => n + groupMembers(pid).length, 0);
      } finally {
        for (const s of [first, second]) {
          if (s && s.child.exitCode === null && s.child.signalCode === null) {
            s.child.kill('SIGTERM');
            await s.exited;
          }
        }
        // after the restart's clean stop (SIGTERM) nothing of either run may be left either
        for (const s of [first, second]) {
          for (const pid of s ? pids(s) : []) {
            for (const p of groupMembers(pid)) {
              leftAfterStop++;
              process.kill(p, 'SIGKILL');
            }
          }
        }
        rmSync(dir, { recursive: true, force: true });
      }
    }
    figures.restarts = { trials: TRIALS, duringBoot, succeeded, leftBehind, leftAfterStop, failures };
    expect(failures).toEqual([]);
    expect(succeeded).toBe(TRIALS);
    expect(leftBehind).toBe(0);
    expect(leftAfterStop).toBe(0);
  }, 900_000);
});
