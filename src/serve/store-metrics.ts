import { Gauge, type Registry } from 'prom-client';

import type { RegionStore } from '../store/region-store.js';

/**
 * `vsnap_snapshot_bytes{snapshot, form}`: each snapshot's current capture, `raw` (its weights) and
 * `stored` (its blobs in the store: less where they are coded, docs/compression.md), read from the
 * store at each scrape; `stored / raw` is the ratio.
 * @internal
 */
export function registerStoreMetrics(registry: Registry, store: RegionStore): void {
  new Gauge({
    name: 'vsnap_snapshot_bytes',
    help: "Bytes of each snapshot's current capture: raw (its weights) and stored (its blobs in the store, less where coded)",
    labelNames: ['snapshot', 'form'],
    registers: [registry],
    async collect() {
      this.reset();
      for (const s of await store.list()) {
        this.set({ snapshot: s.name, form: 'raw' }, s.bytes);
        this.set({ snapshot: s.name, form: 'stored' }, s.storedBytes);
      }
    },
  });
}
