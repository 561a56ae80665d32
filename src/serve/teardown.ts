/**
 * The one way `vsnap serve` comes down: each part it starts adds how to stop it, and `run()`
 * stops them in the reverse order, once, whether the start failed half-way or the handle is
 * closed. A step that fails is logged and the next still runs.
 * @internal
 */
export class Teardown {
  private readonly steps: Array<{ what: string; stop: () => Promise<void> | void }> = [];
  private running: Promise<void> | undefined;

  constructor(private readonly log: (line: string) => void) {}

  /** Adds a part's stop; it runs before the stops added earlier. */
  add(what: string, stop: () => Promise<void> | void): void {
    if (this.running) throw new Error(`serve is stopping: cannot add '${what}'`);
    this.steps.push({ what, stop });
  }

  /** Stops every part, last added first; a second call waits for the first. */
  run(): Promise<void> {
    this.running ??= (async () => {
      for (const step of this.steps.reverse()) {
        try {
          await step.stop();
        } catch (err) {
          this.log(`vsnap: stopping ${step.what} failed: ${(err as Error).message}`);
        }
      }
    })();
    return this.running;
  }
}
