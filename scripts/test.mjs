#!/usr/bin/env node
// `npm test`: what CI runs, in order. Each step before vitest stops the run when it fails (as
// `&&` would); the reliability report (test/reliability/report.mjs) is printed after vitest
// whether vitest passed or not, so a failed run still shows its figures, and the run exits with
// vitest's status when it failed. Arguments go to vitest (`npm test -- test/unit`); such a
// partial run prints the report without failing on the parts it did not run.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const bin = (name) => fileURLToPath(new URL(`../node_modules/.bin/${name}`, import.meta.url));

/** Runs one step (a command and its arguments) in the repository root; its exit status. */
function step({ label, command, args }) {
  console.error(`\n> ${label}`);
  const r = spawnSync(command, args, { cwd: root, stdio: 'inherit' });
  if (r.error) console.error(`${label}: ${r.error.message}`);
  return r.status ?? 1;
}

/**
 * The pipeline: `before` in order (the first failure ends it), then `tests`, then `report`
 * always after `tests`. Returns the exit status of the run. @internal (tested by test/unit/test-runner.test.ts)
 */
export function pipeline({ before, tests, report, partial = false }) {
  for (const s of before) {
    const status = step(s);
    if (status !== 0) return status;
  }
  const tested = step(tests);
  const reported = step(report);
  if (tested !== 0) {
    console.error(`\nnpm test: ${tests.label} failed (exit ${tested}); the report above is of the run that failed`);
    return tested;
  }
  return partial ? 0 : reported;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  process.exitCode = pipeline({
    before: [
      { label: 'the prebuild matches native/', command: process.execPath, args: ['.ci/check-prebuild.mjs'] },
      { label: 'imports go down the layers, no circle', command: process.execPath, args: ['scripts/check-layers.mjs'] },
      { label: 'VSNAP_* variables read in src/settings.ts only', command: process.execPath, args: ['scripts/check-settings.mjs'] },
      { label: 'build (when dist/ is stale)', command: process.execPath, args: ['scripts/build.mjs', '--if-stale'] },
      { label: 'type-check', command: bin('tsc'), args: ['--noEmit'] },
      { label: 'API report', command: bin('api-extractor'), args: ['run'] },
      { label: 'API report of vsnap/plumbing', command: bin('api-extractor'), args: ['run', '-c', 'api-extractor.plumbing.json'] },
      { label: 'API report of vsnap/serve', command: bin('api-extractor'), args: ['run', '-c', 'api-extractor.serve.json'] },
      { label: "the vLLM plugin's tests", command: 'python3', args: ['-m', 'unittest', 'discover', '-s', 'engines/vllm/tests', '-t', 'engines/vllm'] },
    ],
    tests: { label: 'vitest', command: bin('vitest'), args: ['run', ...args] },
    report: { label: 'reliability report', command: process.execPath, args: ['test/reliability/report.mjs'] },
    partial: args.length > 0,
  });
}
