// The body of one rank actor's worker thread: it owns one device through the addon for its
// whole life, runs the load's phases (rankPhases.ts) in order, and answers RELEASE and STOP
// throughout. The device's memory is freed when this thread frees it or exits, even when it is
// terminated (the addon frees it at environment teardown).
import { parentPort, workerData } from 'node:worker_threads';
import { serializeError } from '../errors.js';
import type { DeviceHandle } from '../native/deviceHandle.js';
import type { MainToRank, RankWorkerData } from './rankMessages.js';
import type { Post, RankPhases } from './rankPhases.js';

/** Runs this worker thread as a rank with these phases; answers RELEASE and STOP throughout. */
export function runRankPhases(phases: RankPhases): void {
  const data = workerData as RankWorkerData;
  const port = parentPort!;
  const post: Post = (m) => port.postMessage(m);
  let device: DeviceHandle | undefined;
  /** Set once the supervisor asked this rank to stop: a fill cut short then is not a failure. */
  let stopping = false;

  port.on('message', async (m: MainToRank) => {
    if (m.type === 'RELEASE' || m.type === 'STOP') {
      stopping ||= m.type === 'STOP';
      device?.cancelFill();
      try {
        await device?.free();
        if (m.type === 'RELEASE') post({ type: 'RELEASED' });
      } catch (err) {
        post({ type: 'FAILED', error: serializeError(err) });
      }
      if (m.type === 'STOP') port.close(); // nothing else keeps this thread alive: it ends, and the actor sees exit 0
    }
  });

  const load = async () => {
    const opened = (device = await phases.open(data, post));
    await phases.allocate(opened, data);
    const filled = await phases.fill(opened, data, post);
    await phases.export(opened, filled, post);
  };
  load().catch(async (err: unknown) => {
    try {
      await device?.free();
    } finally {
      if (!stopping) post({ type: 'FAILED', error: serializeError(err) });
    }
  });
}
