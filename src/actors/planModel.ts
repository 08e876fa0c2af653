// Plans one model for this node: parse, validate, shard and fingerprint its checkpoint (in a
// piscina pool), pick the devices of its local ranks (the first tp visible ones) and its fill
// options. Nothing is allocated, so every error here costs seconds, not minutes. The node's own
// model is planned by prepareNode; every other model, at start or loaded later, by this.
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { ModelSpec } from '../modelSpecs.js';
import type { DeviceSlot, FillOptions } from '../native/addon.js';
import { cachedShare, localDevices } from '../native/devices.js';
import { nodeFillOptions } from '../native/fillPolicy.js';
import type { NodeConfig } from '../nodeOptions.js';
import { fileIdentities, type FileIdentity } from './checkFiles.js';

/** A model ready to load: what a model actor (src/machines/model.ts) takes as input. */
export interface PlannedModel {
  spec: ModelSpec;
  plan: CheckpointPlan;
  /** The device of each local rank, in local-rank order. */
  devices: DeviceSlot[];
  fill: FillOptions;
  /** Its checkpoint files as planned: checked again before it serves (checkFiles.ts). */
  files: FileIdentity[];
}

/** How a model's fill reads and how the log says it; shared with the node's own model. */
export async function fillFor(config: Pick<NodeConfig, 'fill'>, devices: DeviceSlot[], plan: CheckpointPlan, log: Logger): Promise<FillOptions> {
  let share: number | undefined;
  const fill = await nodeFillOptions(config.fill, devices, async () => (share = await cachedShare([...new Set(plan.ranks.flatMap((r) => r?.files ?? []))])));
  if (share !== undefined) {
    const percent = Math.round(share * 100);
    if (fill.direct) log.info({ cachedShare: share, fill }, `the page cache holds ${percent}% of the checkpoint: reading it with O_DIRECT (a cold start)`);
    else log.debug({ cachedShare: share }, `the page cache holds ${percent}% of the checkpoint: reading it through the cache`);
  }
  return fill;
}

/** Plans the checkpoint of `spec` at its tp size, for ranks 0..tp-1 of `nodeRank` 0 of its own. */
export async function planSpec(spec: ModelSpec, localRanks: { nodeRank: number; localWorldSize: number }, log: Logger): Promise<CheckpointPlan> {
  const started = performance.now();
  const plan = await planCheckpoint(spec.modelDir, { tpSize: spec.tpSize, planFile: spec.planFile, layouts: spec.layouts });
  const local = plan.ranks.slice(localRanks.nodeRank * localRanks.localWorldSize, (localRanks.nodeRank + 1) * localRanks.localWorldSize);
  log.info(
    {
      model: spec.modelDir,
      name: spec.name,
      architecture: plan.architecture,
      fingerprint: plan.fingerprint,
      tensors: local[0]?.tensors.length,
      bytesPerRank: local.map((r) => r.totalBytes),
      ms: Math.round(performance.now() - started),
    },
    'checkpoint planned',
  );
  return plan;
}

/** Plans a model served beside the node's own: all of its ranks are local. */
export async function planModel(spec: ModelSpec, config: Pick<NodeConfig, 'device' | 'cudaHandles' | 'fill'>, log: Logger): Promise<PlannedModel> {
  const { devices } = await localDevices({ device: config.device, localWorldSize: spec.tpSize, cudaHandles: config.cudaHandles }, log);
  const plan = await planSpec(spec, { nodeRank: 0, localWorldSize: spec.tpSize }, log);
  const files = fileIdentities(plan.ranks.flatMap((r) => r.files));
  return { spec, plan, devices, fill: await fillFor(config, devices, plan, log), files };
}
