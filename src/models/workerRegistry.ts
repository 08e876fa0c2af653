import { Worker } from 'node:worker_threads';
import type { RankWorkerData, WarmRankStart } from './rankMessages.js';

/**
 * Every worker thread a node started, so that stopping or failing the node can wait until
 * each one has really exited (and its addon instance has freed the device) before the process
 * reports done. xstate runs actor cleanups synchronously; a worker's exit is asynchronous.
 *
 * It also starts the ranks' threads: warm ones, started before the node knows its ranks
 * (src/actors/warmRankWorker.ts), are handed a rank when one starts, so that loading a thread's
 * modules overlaps the node's planning instead of following it.
 */
export class WorkerRegistry {
  readonly #exits = new Set<Promise<void>>();
  /** Warm threads no rank took yet, by the local rank they are for. */
  readonly #warm = new Map<number, Worker>();
  /** Set once the node drains: no thread starts warm after that. */
  #draining = false;
  /**
   * What a warm thread runs (src/actors/warmRankWorker.ts), when the node names it: a rank with no
   * warm thread then starts a thread of it too, and hands it its rank at once, so that a bundled
   * daemon's every rank thread runs its bundle (dist/rank-thread.cjs), not dist/src's ES modules.
   */
  readonly #warmModule?: URL;

  constructor(options: { warmModule?: URL } = {}) {
    this.#warmModule = options.warmModule;
  }

  track(worker: Worker): void {
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    this.#exits.add(exited);
    void exited.then(() => this.#exits.delete(exited));
  }

  get size(): number {
    return this.#exits.size;
  }

  /**
   * Starts a warm thread running `module` (src/actors/warmRankWorker.ts) for each local rank in
   * 0..count-1 that has none, unless the node drains; returns how many it started. A thread that
   * fails or exits before a rank takes it is forgotten: its rank then starts a thread of its own,
   * which meets the same failure as a rank's.
   */
  warm(module: URL, count: number, workerData: object): number {
    if (this.#draining) return 0;
    let started = 0;
    for (let localRank = 0; localRank < count; localRank++) {
      if (this.#warm.has(localRank)) continue;
      started++;
      const worker = new Worker(module, { workerData, name: `weightd-rank-${localRank}` });
      this.track(worker);
      const forget = () => {
        if (this.#warm.get(localRank) === worker) this.#warm.delete(localRank);
      };
      worker.on('error', forget);
      worker.once('exit', forget);
      this.#warm.set(localRank, worker);
    }
    return started;
  }

  /** A thread for local rank `data.localRank` running `module`: the warm one (`warm`), or one started now (of the warm module, when the node names one). */
  start(module: URL, data: RankWorkerData): { worker: Worker; warm: boolean } {
    const warm = this.#warm.get(data.localRank);
    if (warm) {
      this.#warm.delete(data.localRank);
      // The warm thread's own 'error' listener stays (it only forgets); the rank's come next.
      const start: WarmRankStart = { type: 'START', module: module.href, data };
      warm.postMessage(start);
      return { worker: warm, warm: true };
    }
    const name = `weightd-rank-${data.localRank}`;
    if (this.#warmModule) {
      const worker = new Worker(this.#warmModule, { workerData: { warm: true }, name });
      this.track(worker);
      const start: WarmRankStart = { type: 'START', module: module.href, data };
      worker.postMessage(start);
      return { worker, warm: false };
    }
    const worker = new Worker(module, { workerData: data, name });
    this.track(worker);
    return { worker, warm: false };
  }

  /** Ends the warm threads no rank took (the node is ready, or stops). */
  dropWarm(): void {
    for (const worker of this.#warm.values()) void worker.terminate();
    this.#warm.clear();
  }

  async drain(): Promise<void> {
    this.#draining = true;
    this.dropWarm();
    while (this.#exits.size) await Promise.all([...this.#exits]);
  }
}
