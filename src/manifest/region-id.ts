/**
 * A region's identity across a snapshot and a live engine: its rank and its key (the lowest-offset
 * tensor in it, or `anon:N`), written `rank/key`. The one place this rule is written.
 * @internal
 */
export function regionId(rank: number, key: string): string {
  return `${rank}/${key}`;
}
