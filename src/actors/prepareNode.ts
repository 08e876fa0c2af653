// First step of a node: plan the checkpoint (parse, validate, shard, fingerprint, in a piscina
// pool) and pick this node's devices. Nothing is allocated yet, so every error here costs
// seconds, not minutes.
import { fromPromise } from 'xstate';
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { NodeConfig } from '../nodeOptions.js';
import { WeightdError } from '../errors.js';
import type { DeviceSlot, FillOptions } from '../native/addon.js';
import { cachedShare, localDevices } from '../native/devices.js';
import { nodeFillOptions } from '../native/fillPolicy.js';
import { acquireDeviceLock, type DeviceLock } from '../serve/deviceLock.js';
import { checkSocketPathLength, removeSocketDirIfCreated, resolveSocketDir, socketPathFor } from '../serve/socketDir.js';
import { VERSION } from '../version.js';
import type { RankKeeping } from './rankMessages.js';

export interface PrepareInput {
  config: NodeConfig;
  log: Logger;
  /** The keeper, found or started meanwhile (SupervisorInput.keeper). */
  keeper?: { socket: string; ready: Promise<void> };
}

export interface Prepared {
  plan: CheckpointPlan;
  /** The device of each local rank, in local-rank order. */
  devices: DeviceSlot[];
  /** How many devices of the backend this node sees (compared across nodes at rendezvous). */
  visibleDevices: number;
  /** The private directory of this node's sockets. */
  socketDir: string;
  /**
   * One lock per local device, taken before loading so a second daemon for the same device
   * fails in milliseconds. Each serve actor owns its lock from then on; startNode unlocks any
   * left when the node ends earlier.
   */
  locks: DeviceLock[];
  /** The fill options every local rank gets (nodeFillOptions): one group, cold or warm reads. */
  fill: FillOptions;
  /** Where the ranks adopt and keep their segments (absent: --keeper off). */
  keeper?: RankKeeping;
}

export const prepareNode = fromPromise<Prepared, PrepareInput>(async ({ input, signal }) => {
  const { config, log } = input;
  const { devices, visible } = await localDevices(config, log);
  const socketDir = resolveSocketDir(config.socketDir);
  const locks: DeviceLock[] = [];
  const unlockDevices = () => locks.forEach((l) => l.unlock());
  // Stopped while planning: nobody will receive the locks, so they go now, not when planning
  // ends (a restart in the same process would find its own devices still locked).
  signal.addEventListener('abort', unlockDevices, { once: true });
  try {
    // Each rank's socket is bound only after its load: a path the kernel refuses fails now, not
    // after minutes of copying.
    for (const d of devices) checkSocketPathLength(socketPathFor(socketDir, d.uuid));
    for (const d of devices) {
      locks.push(acquireDeviceLock(socketDir, d.uuid, (holder) => log.warn({ device: d.uuid, pid: holder.pid }, 'took over the lock of a daemon that no longer runs')));
    }
    const plan = await planLocalRanks(config, log);
    if (signal.aborted) throw new WeightdError('E_STOPPED', 'stopped while planning');
    signal.removeEventListener('abort', unlockDevices);
    let share: number | undefined;
    const fill = await nodeFillOptions(config.fill, devices, async () => (share = await cachedShare([...new Set(plan.ranks.flatMap((r) => r?.files ?? []))])));
    if (share !== undefined) {
      const percent = Math.round(share * 100);
      if (fill.direct) log.info({ cachedShare: share, fill }, `the page cache holds ${percent}% of the checkpoint: reading it with O_DIRECT (a cold start)`);
      else log.debug({ cachedShare: share }, `the page cache holds ${percent}% of the checkpoint: reading it through the cache`);
    }
    // Found or started while the checkpoint was planned; the ranks take from it next.
    await input.keeper?.ready;
    const keeper = input.keeper && { socket: input.keeper.socket, model: config.modelDir, writer: `weightd ${VERSION}` };
    return { plan, devices, visibleDevices: visible, socketDir, locks, fill, keeper };
  } catch (err) {
    unlockDevices();
    removeSocketDirIfCreated(socketDir);
    throw err;
  }
});

async function planLocalRanks(config: NodeConfig, log: Logger): Promise<CheckpointPlan> {
  const started = performance.now();
  const plan = await planCheckpoint(config.modelDir, { tpSize: config.tpSize, planFile: config.planFile, layouts: config.layouts });
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
  return plan;
}
