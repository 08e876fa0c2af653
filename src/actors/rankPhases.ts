// A rank's load as a sequence of named phases (open, allocate, fill, export), which
// runRankPhases.ts runs in order on the rank's worker thread: a worker module other than
// src/actors/rankWorker.ts (a test's fixture that fails at one phase on purpose) runs this same
// code around the phase it replaces.
import { DeviceHandle, type FillResult } from '../native/deviceHandle.js';
import type { RankToMain, RankWorkerData } from './rankMessages.js';

export type Post = (m: RankToMain) => void;
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
    const device = new DeviceHandle(data.device.backend, data.device.index, { uuid: data.device.uuid, cudaHandles: data.cudaHandles });
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
