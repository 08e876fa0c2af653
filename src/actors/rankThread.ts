// A rank's worker thread's side of its link to the main thread: the data the rank runs with and
// the messages the main thread sends it. A thread started with its data (new Worker) has it in
// workerData. A thread started warm (warmRankWorker.ts, while the node still plans) had no rank
// yet: its data comes in its first message, and what the main thread sends before the rank's
// module listens waits here, in order.
import { parentPort, workerData } from 'node:worker_threads';
import type { MainToRank, RankWorkerData, WarmRankStart } from '../models/rankMessages.js';

let handed: RankWorkerData | undefined;
let deliver: ((m: MainToRank) => void) | undefined;
const early: MainToRank[] = [];

/** Whether this thread was started warm: its rank comes in a WarmRankStart message. */
export function startedWarm(): boolean {
  return (workerData as { warm?: unknown } | null)?.warm === true;
}

/** The data this thread's rank runs with. */
export function rankWorkerData(): RankWorkerData {
  return handed ?? (workerData as RankWorkerData);
}

/** Hands every message from the main thread to `handler`, those that came before it first. */
export function onMainMessage(handler: (m: MainToRank) => void): void {
  if (!startedWarm()) {
    parentPort!.on('message', handler);
    return;
  }
  deliver = handler;
  for (const m of early.splice(0)) handler(m);
}

/**
 * A warm thread's wait for its rank: calls `run` with the WarmRankStart once it comes, and from
 * then keeps what the main thread sends until onMainMessage takes it. The port is listened to
 * from the start, so no message can arrive with no listener.
 */
export function awaitWarmStart(run: (start: WarmRankStart) => void): void {
  parentPort!.on('message', (m: WarmRankStart | MainToRank) => {
    if (handed === undefined && m.type === 'START') {
      handed = m.data;
      run(m);
    } else if (deliver) deliver(m as MainToRank);
    else early.push(m as MainToRank);
  });
}
