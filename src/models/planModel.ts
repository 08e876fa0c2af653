// Plans one model for this node: parse, validate, shard and fingerprint its checkpoint (in a
// piscina pool), pick the devices of its local ranks (the first tp visible ones) and its fill
// options. Nothing is allocated, so every error here costs seconds, not minutes. Every model,
// the node's first (prepareNode, on the devices it locked), those it starts with and those loaded
// later, is planned by this.
import { planCheckpoint, type PlanOptions } from '../checkpoint/planCheckpoint.js';
import type { SegmentCut } from '../checkpoint/arenaSegmentBytes.js';
import { WeightdError } from '../errors.js';
import type { CheckpointPlan } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { ModelSpec } from './modelSpecs.js';
import type { WrittenRankData } from './rankMessages.js';
import type { CudaHandles, DeviceSlot, FillOptions } from '../native/addon.js';
import type { KeptRecord as ListedRecord } from '../keeper/keeperProtocol.js';
import type { KeptPlan, KeptPlansRead } from '../keeper/keptPlan.js';
import { cachedShare, localDevices } from '../native/devices.js';
import { nodeFillOptions } from '../native/fillPolicy.js';
import { sampleWithAddon } from '../native/sampleDigest.js';

/** The node as planning a model sees it: its group's shape, and how it picks and fills devices (NodeConfig has all of it). */
export interface ModelNode {
  nnodes: number;
  nodeRank: number;
  localWorldSize: number;
  /** The group's tp size: a model loaded at it spans the group. */
  tpSize: number;
  device: Parameters<typeof localDevices>[0]['device'];
  cudaHandles: CudaHandles;
  fill: FillOptions;
}

/**
 * Where a model's ranks live. nnodes 1: every rank on this node (global rank = local rank), as on
 * a daemon of one node. Otherwise the model spans the group as the node's own does: this node
 * holds ranks nodeRank * localWorldSize .. + localWorldSize - 1, and the swap is all-or-nothing
 * across nodes (src/models/modelGroupMachine.ts).
 */
export interface ModelPlacement {
  nodeRank: number;
  nnodes: number;
  localWorldSize: number;
}

/**
 * The rule (docs/multi-node.md, "Models across nodes"): in a group, a model at the group's tp
 * size spans it; one at most a node's local world size is served by each node alone; any
 * other size has no placement that matches an engine's global ranks.
 */
export function modelPlacement(tpSize: number, config: Pick<ModelNode, 'nnodes' | 'nodeRank' | 'localWorldSize' | 'tpSize'>): ModelPlacement {
  if (spansGroup(tpSize, config)) return { nodeRank: config.nodeRank, nnodes: config.nnodes, localWorldSize: config.localWorldSize };
  if (tpSize <= config.localWorldSize || config.nnodes === 1) return { nodeRank: 0, nnodes: 1, localWorldSize: tpSize };
  throw new WeightdError(
    'E_MODEL_PLACEMENT',
    `--tensor-parallel-size ${tpSize} fits no placement on this group of ${config.nnodes} nodes with ${config.localWorldSize} local ranks each: ` +
      `load it at the group's tp size ${config.tpSize} (it then spans every node) or at most ${config.localWorldSize} (each node serves it alone)`,
    { field: 'tpSize', value: tpSize, groupTpSize: config.tpSize, localWorldSize: config.localWorldSize },
  );
}

/** Whether a model at `tpSize` spans the group (modelPlacement's first case). */
export function spansGroup(tpSize: number, config: Pick<ModelNode, 'nnodes' | 'tpSize'>): boolean {
  return config.nnodes > 1 && tpSize === config.tpSize;
}

/** A model ready to load: what a model actor (src/models/modelMachine.ts) takes as input. */
export interface PlannedModel {
  spec: ModelSpec;
  placement: ModelPlacement;
  plan: CheckpointPlan;
  /** The device of each local rank, in local-rank order. */
  devices: DeviceSlot[];
  fill: FillOptions;
  /**
   * Where it comes from (default 'start': the command line, a --models file, NodeOptions.models).
   * 'load': weightd ctl load or node.load; 'restore': such a load by an earlier daemon, restored
   * from the keeper (src/actors/restoreLoaded.ts). The keeper stores the load request of the
   * latter two with their shards, so the next start restores them too.
   */
  origin?: 'start' | 'load' | 'restore' | 'update';
  /**
   * Its number among its name's versions (docs/weight-updates.md): 0 for a checkpoint (default),
   * N+1 for what a writer committed over the versions before it.
   */
  version?: number;
  /**
   * origin 'update': by local rank, what its rank adopts instead of allocating and filling: the
   * sealed segments of a commit (src/serve/updateDesk.ts), or a restart's kept shard
   * (src/actors/restoreWritten.ts).
   */
  written?: WrittenRankData[];
  /** origin 'update': the model fingerprint of the version it was written over (the keeper's record carries it). */
  base?: string;
  /**
   * origin 'update': the checkpoint directory it was written over, every symbolic link followed
   * as at the commit (writtenDirectory): its kept records' `model` (docs/spec/kept-written.md §1).
   */
  writtenOver?: string;
  /** When it became current (ms since the epoch), for its kept records (RankKeeping.currentSince): a commit's, or a restored version's recorded one. */
  currentSince?: number;
  /** With a keeper: its plan as its local rank 0's record carries it, so a restart plans from it (src/keeper/keptPlan.ts). */
  keptPlan?: KeptPlan;
  /**
   * A load of one node (ModelControl.load), with a keeper: it waits in `starting` until the keeper
   * no longer holds the records of the versions of its name it replaces (MODEL_OLDER_DROPPED), and
   * fails with E_VERSION_NOT_KEPT when they were not dropped (MODEL_OLDER_NOT_DROPPED), so that no
   * restart serves a version a hot swap's reply said was replaced (docs/weight-updates.md).
   */
  dropsOlderFirst?: boolean;
}

/** What the keeper holds at this start (its LIST), so that a model whose shards it holds takes its plan from there. */
export interface KeptAtStart {
  records: readonly ListedRecord[];
  /** This weightd's name and version, as its records name their writer. */
  writer: string;
  /**
   * The plans kept for one model, read before its devices were known (readKeptPlansAhead);
   * undefined when that read failed. `share`: the page cache's share of the files of its local
   * ranks in the plan found, by those files (fillFor), measured meanwhile too.
   */
  ahead?: { spec: ModelSpec; read: Promise<KeptPlansRead | undefined>; share: Promise<{ files: string[]; share: number } | undefined> };
}

/**
 * Starts reading the plans the keeper holds for `spec` (readKeptPlans: the records parsed, the
 * plan's files checked, its bytes unpacked), which needs no device, so that a restart does it
 * while the devices are probed (cuInit: ~100 ms on an H100 host) and planModel, once they are
 * known, only picks (issue 33). A read that fails is done again by planModel, which says why.
 */
export function readKeptPlansAhead(spec: ModelSpec, config: Pick<ModelNode, 'nnodes' | 'nodeRank' | 'localWorldSize' | 'tpSize' | 'device'>, kept: KeptAtStart): KeptAtStart {
  // Never throws, nor leaves a promise to reject unheard while the devices are probed (Node would
  // end on it): a model with no placement reads nothing ahead, and planModel refuses it by name.
  let placement: ModelPlacement;
  try {
    placement = modelPlacement(spec.tpSize, config);
  } catch {
    return kept;
  }
  const read = (async () => {
    const [{ readKeptPlans, planKeyFields }, { keptPlanIn }] = await Promise.all([import('../keeper/keptPlan.js'), import('../keeper/keptRecord.js')]);
    return readKeptPlans(kept.records, planKeyFields(spec, kept.writer), placement.nodeRank * placement.localWorldSize, keptPlanIn);
  })().catch(() => undefined);
  // What fillFor asks when the devices are GPUs (a cold cache reads with O_DIRECT; nothing on the
  // host backend), of the files a plan found names: every device's plan of one model names the same files.
  const share = read.then(async (r) => {
    const found = config.device === 'host' ? undefined : r?.plans.find((p) => 'plan' in p.read)?.read;
    if (!found || !('plan' in found)) return undefined;
    const files = localFiles(found.plan, placement);
    return { files, share: await cachedShare(files) };
  }).catch(() => undefined);
  return { ...kept, ahead: { spec, read, share } };
}

/** Versions writers committed that the keeper held at a start (src/actors/restoreWritten.ts): served once the node is ready, and which of each name was current. */
export interface RestoredVersions {
  /** By name, then by version, ascending: the order they are served in. */
  models: PlannedModel[];
  /** Per name, the version whose records say it became current last: the one current when the last daemon ended. */
  current: Array<{ name: string; version: number }>;
}

/** The ranks of `plan` this node holds (its placement's). */
function localRanksOf(plan: CheckpointPlan, placement: Pick<ModelPlacement, 'nodeRank' | 'localWorldSize'>): CheckpointPlan['ranks'] {
  return plan.ranks.slice(placement.nodeRank * placement.localWorldSize, (placement.nodeRank + 1) * placement.localWorldSize);
}

/** Every file `ranks` read, each once, in the order they first name them. */
function filesOf(ranks: CheckpointPlan['ranks']): string[] {
  return [...new Set(ranks.flatMap((r) => r?.files ?? []))];
}

/** The files this node's ranks of `plan` read. */
function localFiles(plan: CheckpointPlan, placement: ModelPlacement): string[] {
  return filesOf(localRanksOf(plan, placement));
}

/** How a model's fill reads and how the log says it. */
async function fillFor(config: Pick<ModelNode, 'fill'>, devices: DeviceSlot[], plan: CheckpointPlan, log: Logger, ahead?: KeptAtStart['ahead']): Promise<FillOptions> {
  let share: number | undefined;
  const measure = async (files: string[]) => {
    const measured = await ahead?.share;
    return measured && measured.files.join('\0') === files.join('\0') ? measured.share : cachedShare(files);
  };
  const fill = await nodeFillOptions(config.fill, devices, async () => (share = await measure(filesOf(plan.ranks))));
  if (share !== undefined) {
    const percent = Math.round(share * 100);
    if (fill.direct) log.info({ cachedShare: share, fill }, `the page cache holds ${percent}% of the checkpoint: reading it with O_DIRECT (a cold start)`);
    else log.debug({ cachedShare: share }, `the page cache holds ${percent}% of the checkpoint: reading it through the cache`);
  }
  return fill;
}

/** The one line that says a model is planned, and where from: its headers, or the plan its shards were kept with. */
function logPlanned(spec: ModelSpec, localRanks: { nodeRank: number; localWorldSize: number }, plan: CheckpointPlan, started: number, from: 'headers' | 'keeper', log: Logger): void {
  const local = localRanksOf(plan, localRanks);
  log.info(
    {
      model: spec.modelDir,
      name: spec.name,
      architecture: plan.architecture,
      fingerprint: plan.fingerprint,
      tensors: local[0]?.tensors.length,
      bytesPerRank: local.map((r) => r.totalBytes),
      from,
      // The safetensors headers read and checked to make it: every file's, or none.
      headersRead: from === 'headers' ? plan.files.length : 0,
      ms: Math.round(performance.now() - started),
    },
    'checkpoint planned',
  );
  for (const [layout, why] of Object.entries(plan.refusedLayouts)) {
    log.warn({ model: spec.modelDir, layout, code: why.code }, `layout ${layout} is not served: ${why.message}; engines that ask for it load from disk, the other layouts are served`);
  }
}

type Segments = NonNullable<PlanOptions['segments']>;

/** Plans the checkpoint of `spec` at its tp size from its files, logging this node's share of its ranks. */
async function planSpec(spec: ModelSpec, localRanks: { nodeRank: number; localWorldSize: number }, segments: Segments, log: Logger): Promise<CheckpointPlan> {
  const started = performance.now();
  const plan = await planCheckpoint(spec.modelDir, { tpSize: spec.tpSize, planFile: spec.planFile, layouts: spec.layouts, segments, sampler: sampleWithAddon });
  logPlanned(spec, localRanks, plan, started, 'headers', log);
  return plan;
}

/**
 * With a keeper: the plan kept with this model's shards when every check passes
 * (src/keeper/keptPlan.ts), else the plan from the headers (a debug line says why), with the
 * field its records are to carry.
 */
async function planKept(spec: ModelSpec, placement: ModelPlacement, devices: DeviceSlot[], cut: SegmentCut, kept: KeptAtStart, log: Logger): Promise<{ plan: CheckpointPlan; keptPlan?: KeptPlan }> {
  // Only with a keeper: a plain start loads neither these nor the record's schema.
  const [{ chooseKeptPlan, packPlan, planInputIdentities, planKeyFields, readKeptPlans }, { keptPlanIn }, { keptSegmentCut }] = await Promise.all([
    import('../keeper/keptPlan.js'),
    import('../keeper/keptRecord.js'),
    import('../keeper/keptSegmentCut.js'),
  ]);
  const started = performance.now();
  const fields = planKeyFields(spec, kept.writer);
  const local = { devices: devices.map((d) => d.uuid), firstGlobalRank: placement.nodeRank * placement.localWorldSize };
  const read = (kept.ahead?.spec === spec ? await kept.ahead.read : undefined) ?? (await readKeptPlans(kept.records, fields, local.firstGlobalRank, keptPlanIn));
  const found = chooseKeptPlan(read, kept.records, fields, local);
  if ('plan' in found) {
    logPlanned(spec, placement, found.plan, started, 'keeper', log);
    return { plan: found.plan, keptPlan: found.kept };
  }
  log.debug({ model: spec.modelDir, name: spec.name, reason: found.why }, `planning model "${spec.name}" from its safetensors headers, not from the keeper: ${found.why}`);
  let inputs;
  try {
    inputs = planInputIdentities(spec);
  } catch {
    // A file planning needs is missing: planning says so, by name.
  }
  const plan = await planSpec(spec, placement, keptSegmentCut(cut, spec.name, devices.map((d) => d.uuid), kept.records), log);
  if (inputs === undefined) return { plan };
  return { plan, keptPlan: await packPlan(plan, fields, inputs) };
}

/**
 * Plans a model on this node's share of its ranks (modelPlacement). `devices`: its local ranks'
 * devices when the caller picked them already (prepareNode, which locks them first); else the
 * first visible ones. `kept`: what the keeper holds at a start, to plan from a kept plan.
 */
export async function planModel(spec: ModelSpec, config: ModelNode, log: Logger, devices?: DeviceSlot[], kept?: KeptAtStart): Promise<PlannedModel> {
  const placement = modelPlacement(spec.tpSize, config);
  devices ??= (await localDevices({ device: config.device, localWorldSize: placement.localWorldSize, cudaHandles: config.cudaHandles }, log)).devices;
  // A host arena is cut into segments by default (src/checkpoint/arenaSegmentBytes.ts); a cuda one is not.
  const cut: SegmentCut = devices[0]?.backend === 'host' ? 'host' : 'whole';
  const { plan, keptPlan } = kept ? await planKept(spec, placement, devices, cut, kept, log) : { plan: await planSpec(spec, placement, cut, log) };
  const local = localRanksOf(plan, placement);
  const ahead = kept?.ahead?.spec === spec ? kept.ahead : undefined;
  return { spec, placement, plan, devices, fill: await fillFor(config, devices, { ...plan, ranks: local }, log, ahead), ...(keptPlan ? { keptPlan } : {}) };
}
