// Descriptor and memory counts around failure tests: a failure path must give back every
// descriptor it opened, and must not leave memory growing.
import { readdirSync, readlinkSync } from 'node:fs';

import { expect } from 'vitest';

import { releaseIdleResources } from '../../src/transfer/idle.js';

export interface Usage {
  /** Open descriptors of this process (/proc/self/fd). */
  fds: number;
  /** Resident set size, bytes. */
  rss: number;
}

export function usage(): Usage {
  return { fds: readdirSync('/proc/self/fd').length, rss: process.memoryUsage().rss };
}

/** What each open descriptor of this process points at. */
export function descriptors(): Map<string, string> {
  const out = new Map<string, string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      out.set(fd, readlinkSync(`/proc/self/fd/${fd}`));
    } catch {
      // closed between the listing and the look
    }
  }
  return out;
}

/** One before/after line of the figures. */
export interface LeakLine {
  test: string;
  fdsBefore: number;
  fdsAfter: number;
  rssBeforeMiB: number;
  rssAfterMiB: number;
}

const MiB = 2 ** 20;

/**
 * Runs `fn` (a failure test) and asserts it leaks no descriptor: after it, with the idle staging
 * pools released, this process has no more open descriptors than before. RSS is recorded.
 */
export async function noLeak(test: string, lines: LeakLine[], fn: () => Promise<void>): Promise<void> {
  await releaseIdleResources();
  const before = usage();
  const open = descriptors();
  await fn();
  await releaseIdleResources();
  const after = usage();
  const added = [...descriptors()].filter(([fd, target]) => open.get(fd) !== target).map(([fd, target]) => `${fd} -> ${target}`);
  lines.push({ test, fdsBefore: before.fds, fdsAfter: after.fds, rssBeforeMiB: +(before.rss / MiB).toFixed(1), rssAfterMiB: +(after.rss / MiB).toFixed(1) });
  expect(after.fds, `${test}: descriptors before ${before.fds}, after ${after.fds}; new: ${added.join(', ')}`).toBeLessThanOrEqual(before.fds);
}
