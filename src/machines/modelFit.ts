// Whether a model's ranks fit in the memory their devices have free now, judged before any of
// them allocates. Host devices all draw on the one host memory (and its cgroup), so their ranks
// are summed together; each GPU is its own pool. Pure: the machine calls it in a guard.
import type { DeviceInfo } from '../native/addon.js';

export interface RankNeed {
  localRank: number;
  /** What the rank will allocate: the sum of its segments. */
  bytes: number;
  /** Its device as opened, with the free memory it reported then. */
  device: DeviceInfo;
}

/** The first pool that is short, with what it needs and has; undefined when all fit. */
export interface Shortfall {
  /** "host memory" or the GPU's uuid. */
  pool: string;
  neededBytes: number;
  freeBytes: number;
}

export function modelShortfall(needs: readonly RankNeed[]): Shortfall | undefined {
  const pools = new Map<string, Shortfall>();
  for (const n of needs) {
    const pool = n.device.backend === 'host' ? 'host memory' : n.device.uuid;
    const p = pools.get(pool) ?? { pool, neededBytes: 0, freeBytes: n.device.freeBytes };
    p.neededBytes += n.bytes;
    // Readings of one pool taken moments apart: the smallest is the safe one.
    p.freeBytes = Math.min(p.freeBytes, n.device.freeBytes);
    pools.set(pool, p);
  }
  return [...pools.values()].find((p) => p.neededBytes > p.freeBytes);
}

export function formatGiB(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}
