import type { Worker } from 'node:worker_threads';
import type { MainToRank } from './rankMessages.js';

/**
 * Every worker thread a node started, so that stopping or failing the node can wait until
 * each one has really exited (and its addon instance has freed the device) before the process
 * reports done. xstate runs actor cleanups synchronously; a worker's exit is asynchronous.
 */
export class WorkerRegistry {
  readonly #exits = new Set<Promise<void>>();
  readonly #live = new Set<Worker>();

  track(worker: Worker): void {
    this.#live.add(worker);
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    this.#exits.add(exited);
    void exited.then(() => {
      this.#exits.delete(exited);
      this.#live.delete(worker);
    });
  }

  /**
   * Tells every rank thread still running something no supervisor state depends on (a keeper
   * came back: KEEP_AGAIN); a rank not yet loaded ignores it and keeps its segments once it is.
   */
  broadcast(m: MainToRank): void {
    for (const w of this.#live) w.postMessage(m);
  }

  get size(): number {
    return this.#exits.size;
  }

  async drain(): Promise<void> {
    while (this.#exits.size) await Promise.all([...this.#exits]);
  }
}
