import type { Worker } from 'node:worker_threads';

/**
 * Every worker thread a node started, so that stopping or failing the node can wait until
 * each one has really exited (and its addon instance has freed the device) before the process
 * reports done. xstate runs actor cleanups synchronously; a worker's exit is asynchronous.
 */
export class WorkerRegistry {
  readonly #exits = new Set<Promise<void>>();

  track(worker: Worker): void {
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    this.#exits.add(exited);
    void exited.then(() => this.#exits.delete(exited));
  }

  get size(): number {
    return this.#exits.size;
  }

  async drain(): Promise<void> {
    while (this.#exits.size) await Promise.all([...this.#exits]);
  }
}
