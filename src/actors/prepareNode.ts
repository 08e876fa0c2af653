// First step of a node: plan the checkpoint (parse, validate, shard, fingerprint, in a piscina
// pool) and pick this node's devices. Nothing is allocated yet, so every error here costs
// seconds, not minutes.
import { fromPromise } from 'xstate';
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { NodeConfig } from '../nodeOptions.js';
import { localDevices, type DeviceSlot } from '../native/devices.js';
import { sweepStaleSegments } from '../native/sweepStaleSegments.js';

export interface PrepareInput {
  config: NodeConfig;
  log: Logger;
}

export interface Prepared {
  plan: CheckpointPlan;
  /** The device of each local rank, in local-rank order. */
  devices: DeviceSlot[];
  /** How many devices of the backend this node sees (compared across nodes at rendezvous). */
  visibleDevices: number;
  shmDir: string;
}

export const prepareNode = fromPromise<Prepared, PrepareInput>(async ({ input }) => {
  const { config, log } = input;
  const { devices, visible, shmDir } = localDevices(config, log);
  for (const removed of sweepStaleSegments(shmDir)) log.warn({ file: removed }, 'removed a shared-memory segment left by a daemon that no longer runs');
  const started = performance.now();
  const plan = await planCheckpoint(config.modelDir, { tpSize: config.tpSize, planFile: config.planFile });
  const local = plan.ranks.slice(config.nodeRank * config.localWorldSize, (config.nodeRank + 1) * config.localWorldSize);
  log.info(
    {
      model: config.modelDir,
      architecture: plan.architecture,
      fingerprint: plan.fingerprint,
      tensors: local[0]?.tensors.length,
      bytesPerRank: local.map((r) => r.totalBytes),
      ms: Math.round(performance.now() - started),
    },
    'checkpoint planned',
  );
  return { plan, devices, visibleDevices: visible, shmDir };
});
