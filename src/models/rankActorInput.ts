// What the rank actor (src/actors/rankActor.ts) takes and is told: declared beside the model
// machine and the supervisor that spawn it, so neither imports the actor's implementation.
import type { Logger } from '../log.js';
import type { RankWorkerData } from './rankMessages.js';
import type { WorkerRegistry } from './workerRegistry.js';

export interface RankActorInput {
  /** The worker thread's module; it speaks rankMessages.ts (src/actors/rankPhases.ts runs a rank). */
  worker: URL;
  workerData: RankWorkerData;
  log: Logger;
  workers: WorkerRegistry;
}

export type RankCommand = { type: 'RANK_RELEASE' } | { type: 'RANK_STOP' } | { type: 'RANK_ADMIT' } | { type: 'RANK_KEEP' } | { type: 'RANK_UNKEEP' };
