import { afterEach, describe, expect, it } from 'vitest';

import { failpoint, pausePoint, setFailpointHandler } from '../../src/store/failpoints.js';
import { holdAt, installFailpoints } from '../helpers/failpoints.mjs';

// The failpoints of capture and publish do nothing in the product; a crash test's child process
// installs the handler (test/helpers/failpoints.mjs) from its own environment. Here: both halves
// in this process, with recorders in place of SIGKILL.

afterEach(() => setFailpointHandler(undefined));

function recorder() {
  const events: string[] = [];
  return { events, io: { kill: () => void events.push('kill'), write: (line: string) => void events.push(line.trim()) } };
}

describe('failpoints', () => {
  it('do nothing without a handler, whatever the environment says', () => {
    const saved = { ...process.env };
    try {
      Object.assign(process.env, { VSNAP_FAILPOINTS: 'publish.blob', VSNAP_FAILPOINT_AT: '1', TEST_FAILPOINTS: 'publish.blob', TEST_FAILPOINT_AT: '1' });
      expect(() => failpoint('publish.blob')).not.toThrow(); // still running: nothing killed this process
    } finally {
      process.env = saved;
    }
  });

  it('call the handler installed in the process, in order, until it is removed', () => {
    const seen: string[] = [];
    setFailpointHandler((name) => seen.push(name));
    failpoint('capture.after-transfer');
    failpoint('publish.blob');
    setFailpointHandler(undefined);
    failpoint('publish.after-blobs');
    expect(seen).toEqual(['capture.after-transfer', 'publish.blob']);
  });

  it("the test helper's handler reaches the product's points: by name", () => {
    const { events, io } = recorder();
    expect(installFailpoints({ TEST_FAILPOINTS: 'publish.after-blobs,publish.after-current' }, io)).toBe(true);
    failpoint('publish.blob');
    failpoint('publish.after-blobs');
    expect(events).toEqual(['kill']);
  });

  it('by count, saying the point it stops at, and with a trace of each point reached', () => {
    const { events, io } = recorder();
    installFailpoints({ TEST_FAILPOINT_AT: '2', TEST_FAILPOINT_TRACE: '1' }, io);
    failpoint('capture.after-transfer');
    failpoint('publish.blob');
    expect(events).toEqual(['failpoint-reached 1 capture.after-transfer', 'failpoint-reached 2 publish.blob', 'failpoint publish.blob', 'kill']);
  });

  it('installs nothing when the environment asks for nothing, and refuses a count that is not a number', () => {
    expect(installFailpoints({})).toBe(false);
    expect(() => failpoint('publish.blob')).not.toThrow();
    expect(() => installFailpoints({ TEST_FAILPOINT_AT: 'third' })).toThrow(/TEST_FAILPOINT_AT=third/);
  });

  it('a pause point goes on at once without a handler; holdAt holds its own point, the first time, until released', async () => {
    await pausePoint('snapshot.opened');
    const hold = holdAt('snapshot.opened');
    const steps: string[] = [];
    await pausePoint('other.point'); // not held
    const first = pausePoint('snapshot.opened').then(() => steps.push('first on'));
    await hold.reached;
    await pausePoint('snapshot.opened'); // the second arrival is not held
    steps.push('second on');
    expect(steps).toEqual(['second on']);
    hold.release();
    await first;
    expect(steps).toEqual(['second on', 'first on']);
    hold.remove();
    await pausePoint('snapshot.opened');
  });
});
