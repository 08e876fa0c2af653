// The body of one rank actor's worker thread: it owns one device through the addon for its
// whole life. The device's memory is freed when this thread frees it or exits, even when it
// is terminated (the addon frees it at environment teardown). The load is a sequence of named
// phases so that a worker module other than src/actors/rankWorker.ts (a test's fixture that
// fails at one phase on purpose) runs this same code around the phase it replaces.
import { parentPort, workerData } from 'node:worker_threads';
import { serializeError } from '../errors.js';
import { DeviceHandle, type FillResult } from '../native/deviceHandle.js';
import type { MainToRank, RankToMain, RankWorkerData } from './rankMessages.js';

type Post = (m: RankToMain) => void;
type Awaitable<T> = T | Promise<T>;

/** A rank's load, in the order the worker runs it. */
export interface RankPhases {
  /** Opens the device (context or shared-memory directory) and reports it. */
  open(data: RankWorkerData, post: Post): Awaitable<DeviceHandle>;
  allocate(device: DeviceHandle, data: RankWorkerData): Awaitable<void>;
  fill(device: DeviceHandle, data: RankWorkerData, post: Post): Awaitable<FillResult>;
  /** Exports the segments and reports the rank loaded; the worker then serves until told otherwise. */
  export(device: DeviceHandle, filled: FillResult, post: Post): Awaitable<void>;
}

export const rankPhases: RankPhases = {
  open(data, post) {
    const device = new DeviceHandle(data.device.backend, data.device.index, { uuid: data.device.uuid, shmDir: data.shmDir });
    post({ type: 'DEVICE', info: device.info() });
    return device;
  },
  allocate(device, data) {
    // Each backend checks its free memory before allocating and names the shortfall.
    return device.allocate(data.plan.segments);
  },
  fill(device, { plan, fill }, post) {
    return device.fill(plan.files, plan.ops, plan.totalBytes, { ...fill, zeroRanges: plan.zeroRanges }, (p) => post({ type: 'PROGRESS', ...p }));
  },
  export(device, { bytes, seconds }, post) {
    const segments = device.exportSegments();
    post({ type: 'LOADED', info: device.info(), segments, bytes, seconds });
  },
};

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
