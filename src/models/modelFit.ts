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

/** One memory pool a model draws on, with what its ranks need of it and what it has free. */
export interface PoolNeed {
  /** "host memory" or the GPU's uuid. */
  pool: string;
  neededBytes: number;
  freeBytes: number;
}

/** The pool a device's memory comes from: "host memory" for every host device, else the GPU's uuid. */
export function poolOf(device: Pick<DeviceInfo, 'backend' | 'uuid'>): string {
  return device.backend === 'host' ? 'host memory' : device.uuid;
}

/** The first pool that is short, with what it needs and has; undefined when all fit. */
export function modelShortfall(needs: readonly RankNeed[]): PoolNeed | undefined {
  return modelPools(needs).find((p) => p.neededBytes > p.freeBytes);
}

/** Every pool the ranks draw on, with what they need of it and what it has free. */
export function modelPools(needs: readonly RankNeed[]): PoolNeed[] {
  const pools = new Map<string, PoolNeed>();
  for (const n of needs) {
    const pool = poolOf(n.device);
    const p = pools.get(pool) ?? { pool, neededBytes: 0, freeBytes: n.device.freeBytes };
    p.neededBytes += n.bytes;
    // Readings of one pool taken moments apart: the smallest is the safe one.
    p.freeBytes = Math.min(p.freeBytes, n.device.freeBytes);
    pools.set(pool, p);
  }
  return [...pools.values()];
}

export function formatGiB(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}
