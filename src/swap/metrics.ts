import { Counter, Gauge, Histogram, Registry } from 'prom-client';

/** The controller's Prometheus metrics. @internal */
export class SwapMetrics {
  readonly registry: Registry;
  readonly swaps: Counter<'engine' | 'action' | 'result'>;
  readonly swapSeconds: Histogram<'engine' | 'action' | 'tier'>;
  readonly awake: Gauge;
  readonly queueDepth: Gauge<'engine'>;
  readonly bytesMoved: Counter<'engine'>;
  readonly requests: Counter<'engine' | 'result'>;
  readonly recoveries: Counter<'engine' | 'reason' | 'result'>;
  readonly recoverySeconds: Histogram<'engine' | 'reason'>;

  constructor(registry?: Registry) {
    this.registry = registry ?? new Registry();
    const registers = [this.registry];
    this.swaps = new Counter({ name: 'vsnap_swaps_total', help: 'Engine suspends and restores, by result', labelNames: ['engine', 'action', 'result'], registers });
    this.swapSeconds = new Histogram({
      name: 'vsnap_swap_seconds',
      help: 'Seconds per suspend or restore',
      labelNames: ['engine', 'action', 'tier'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120],
      registers,
    });
    this.awake = new Gauge({ name: 'vsnap_awake_engines', help: 'Engines awake now', registers });
    this.queueDepth = new Gauge({ name: 'vsnap_queue_depth', help: 'Requests waiting for an engine to wake', labelNames: ['engine'], registers });
    this.bytesMoved = new Counter({ name: 'vsnap_bytes_moved_total', help: 'Weight bytes restored to GPUs', labelNames: ['engine'], registers });
    this.recoveries = new Counter({
      name: 'vsnap_recoveries_total',
      help: "Restores whose snapshot could not be used, recovered through the engine's own loader (reload_weights), by reason and result",
      labelNames: ['engine', 'reason', 'result'],
      registers,
    });
    this.recoverySeconds = new Histogram({
      name: 'vsnap_recovery_seconds',
      help: 'Seconds per successful recovery (wake, reload of the weights, checks; a required capture included)',
      labelNames: ['engine', 'reason'],
      buckets: [0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600],
      registers,
    });
    this.requests = new Counter({ name: 'vsnap_leases_total', help: 'Engine leases asked for, by result', labelNames: ['engine', 'result'], registers });
  }
}
