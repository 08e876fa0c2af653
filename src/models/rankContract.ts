// What the rank actor (src/actors/rankActor.ts) takes, is told and reports: declared beside the
// model machine and the supervisor that spawn it, so neither imports the actor's implementation.
import type { SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import type { DeviceInfo, SegmentExport } from '../native/addon.js';
import type { RankSource } from '../nodeStatus.js';
import type { RankWorkerData } from './rankMessages.js';
import type { WorkerRegistry } from './workerRegistry.js';

export interface RankActorInput {
  /** The worker thread's module; it speaks rankMessages.ts (src/actors/rankPhases.ts runs a rank). */
  worker: URL;
  workerData: RankWorkerData;
  log: Logger;
  workers: WorkerRegistry;
}

export type RankCommand = { type: 'RANK_RELEASE' } | { type: 'RANK_STOP' } | { type: 'RANK_ADMIT' } | { type: 'RANK_KEEP' } | { type: 'RANK_UNKEEP' } | { type: 'RANK_KEEP_AGAIN'; currentSince?: number };

export type RankEvent =
  /** adoptable: the rank will adopt a kept shard, needing no new memory (RankToMain DEVICE). */
  | { type: 'RANK_DEVICE'; localRank: number; info: DeviceInfo; adoptable?: boolean }
  | { type: 'RANK_PROGRESS'; localRank: number; bytes: number; totalBytes: number; seconds: number; waitingForGroup: boolean }
  | { type: 'RANK_LOADED'; localRank: number; device: DeviceInfo; segments: SegmentExport[]; bytes: number; seconds: number; source: RankSource; digests?: string[]; descriptors?: 'checking' }
  /** RankToMain DESCRIPTORS_CHECKED. */
  | { type: 'RANK_DESCRIPTORS_CHECKED'; localRank: number; info?: DeviceInfo; error?: SerializedError }
  | { type: 'RANK_KEPT'; localRank: number; kept: boolean; reason?: string; currentSince?: number }
  | { type: 'RANK_RELEASED'; localRank: number }
  | { type: 'RANK_STOPPED'; localRank: number }
  | { type: 'RANK_FAILED'; localRank: number; error: SerializedError };
