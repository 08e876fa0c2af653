import type { RankServiceStats } from '../serve/rankService.js';

/**
 * The live socket servers of a node, by local rank, so status and metrics can report clients
 * and leases without the machine holding server objects in its context.
 */
export class ServerRegistry {
  readonly #stats = new Map<number, () => RankServiceStats>();

  register(localRank: number, stats: () => RankServiceStats): void {
    this.#stats.set(localRank, stats);
  }

  unregister(localRank: number): void {
    this.#stats.delete(localRank);
  }

  /** The rank's server counters, or undefined while it has no server. */
  stats(localRank: number): RankServiceStats | undefined {
    return this.#stats.get(localRank)?.();
  }
}
