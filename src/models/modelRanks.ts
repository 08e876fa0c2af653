// A model's local ranks as child actors (the model machine's): their actor ids, and what each
// rank actor and rank service actor is spawned with.
import type { CheckpointPlan } from '../checkpoint/types.js';
import { fillPlanOf } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { CudaHandles, DeviceSlot, FillOptions } from '../native/addon.js';
import type { RankStatus } from '../nodeStatus.js';
import type { RankServiceInput } from '../serve/serveEvents.js';
import type { ServerRegistry } from '../serve/serverRegistry.js';
import { toServedRankData } from '../serve/servedRankData.js';
import type { RankActorInput } from './rankContract.js';
import type { RankWorkerData, WrittenRankData } from './rankMessages.js';
import type { WorkerRegistry } from './workerRegistry.js';

export const rankActorId = (localRank: number) => `rank-${localRank}`;
export const serveActorId = (localRank: number) => `serve-${localRank}`;

/** What a model's local ranks are made of (from its PlannedModel). */
export interface ModelRanks {
  name: string;
  /** Its number among its name's versions (PlannedModel.version). */
  version?: number;
  /** A version a writer committed: each local rank's segments and digests (PlannedModel.written). */
  written?: WrittenRankData[];
  plan: CheckpointPlan;
  nodeRank: number;
  nnodes: number;
  /** The device of each local rank, in local-rank order. */
  devices: DeviceSlot[];
  fill: FillOptions;
}

/** Where the ranks run: the worker module and its registry, and the CUDA handle kind. */
export interface RankHost {
  rankWorker: URL;
  workers: WorkerRegistry;
  cudaHandles: CudaHandles;
}

/** The rank actor of local rank `r`; `phases`: how its worker keeps and is admitted (RankWorkerData). */
export function rankActorInput(model: ModelRanks, r: RankStatus, host: RankHost, log: Logger, phases: Pick<RankWorkerData, 'keeper' | 'awaitAdmission' | 'keepOnceServing'>): RankActorInput {
  return {
    log,
    worker: host.rankWorker,
    workers: host.workers,
    workerData: {
      nodeRank: model.nodeRank,
      localRank: r.localRank,
      globalRank: r.globalRank,
      device: model.devices[r.localRank]!,
      cudaHandles: host.cudaHandles,
      plan: fillPlanOf(model.plan.ranks[r.globalRank]!),
      files: model.plan.files,
      fill: model.fill,
      ...(model.written ? { written: model.written[r.localRank] } : {}),
      ...phases,
      // The model's plan is kept once, with its local rank 0's shard.
      ...(phases.keeper?.plan !== undefined && r.localRank !== 0 ? { keeper: { ...phases.keeper, plan: undefined } } : {}),
    },
  };
}

/** The rank service actor of local rank `r`, once it is resident: `version` is the version its leases count under. */
export function rankServiceInput(model: ModelRanks, r: RankStatus, serve: { socketDir: string; servers: ServerRegistry; version: string }, log: Logger): RankServiceInput {
  return {
    log,
    socketDir: serve.socketDir,
    servers: serve.servers,
    version: serve.version,
    rank: toServedRankData({
      name: model.name,
      version: model.version,
      plan: model.plan,
      globalRank: r.globalRank,
      localRank: r.localRank,
      nodeRank: model.nodeRank,
      nnodes: model.nnodes,
      backend: model.devices[r.localRank]!.backend,
      device: r.device!,
      segments: r.segments ?? [],
      digests: r.digests ?? [],
      written: model.written !== undefined,
      digestOn: model.fill.digestOn,
    }),
    ...(r.descriptors === 'checking' ? { descriptorsChecking: true } : {}),
  };
}
