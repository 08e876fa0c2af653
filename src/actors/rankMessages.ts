// Typed messages between a rank actor (main thread) and its worker thread.
import type { RankPlan } from '../checkpoint/types.js';
import type { SerializedError } from '../errors.js';
import type { CudaHandles, DeviceInfo, DeviceSlot, FillOptions, SegmentExport } from '../native/addon.js';

export interface RankWorkerData {
  nodeRank: number;
  localRank: number;
  globalRank: number;
  device: DeviceSlot;
  /** cuda: how segments are allocated and exported (--cuda-handles). */
  cudaHandles: CudaHandles;
  plan: RankPlan;
  fill: FillOptions;
}

export type RankToMain =
  | { type: 'DEVICE'; info: DeviceInfo }
  | { type: 'PROGRESS'; bytes: number; totalBytes: number; seconds: number; waitingForGroup: boolean }
  | { type: 'LOADED'; info: DeviceInfo; segments: SegmentExport[]; bytes: number; seconds: number }
  | { type: 'FAILED'; error: SerializedError }
  | { type: 'RELEASED' }
  | { type: 'LOG'; level: 'debug' | 'info' | 'warn' | 'error'; msg: string; fields?: Record<string, unknown> };

export type MainToRank = { type: 'RELEASE' } | { type: 'STOP' };
