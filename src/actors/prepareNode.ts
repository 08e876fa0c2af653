// First step of a node: plan its checkpoints (parse, validate, shard, fingerprint, in a piscina
// pool), the node's own and every other model it starts with, and pick this node's devices.
// Nothing is allocated yet, so every error here costs seconds, not minutes.
import { fromPromise } from 'xstate';
import type { CheckpointPlan } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { NodeConfig } from '../nodeOptions.js';
import { WeightdError } from '../errors.js';
import { refuseSameCheckpoint } from '../models/alreadyLoadedError.js';
import type { DeviceSlot } from '../native/addon.js';
import { localDevices } from '../native/devices.js';
import { dropUnplanned } from '../keeper/dropUnplanned.js';
import { KeeperClient } from '../keeper/keeperClient.js';
import type { ShardKey } from '../keeper/shardKey.js';
import { shardsOf } from '../models/shardsOf.js';
import { acquireDeviceLock, type DeviceLock } from '../wire/deviceLock.js';
import { checkSocketPathLength, removeSocketDirIfCreated, resolveSocketDir, socketPathFor } from '../wire/socketDir.js';
import { VERSION } from '../version.js';
import { fillFor, planModel, planSpec, type PlannedModel } from '../models/planModel.js';
import type { PrepareInput, Prepared } from '../machines/supervisorActors.js';

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
    const plan = await planSpec(config.models[0]!, config, log);
    const models = await Promise.all(config.models.slice(1).map((spec) => planModel(spec, config, log)));
    refuseSameCheckpoint([{ ...config.models[0]!, fingerprint: plan.fingerprint }, ...models.map((m) => ({ ...m.spec, fingerprint: m.plan.fingerprint }))]);
    if (signal.aborted) throw new WeightdError('E_STOPPED', 'stopped while planning');
    signal.removeEventListener('abort', unlockDevices);
    for (const lock of locks) input.servers.holdLock(lock);
    const fill = await fillFor(config, devices, plan, log);
    // Found or started while the checkpoint was planned; the ranks take from it next.
    await input.keeper?.ready;
    const keeper = input.keeper && { socket: input.keeper.socket, model: config.models[0].modelDir, writer: `weightd ${VERSION}` };
    const records = keeper ? await listKept(keeper.socket, log) : undefined;
    if (keeper && records) {
      const started = [{ name: config.models[0].name, fingerprint: plan.fingerprint }, ...models.map((m) => ({ name: m.spec.name, fingerprint: m.plan.fingerprint }))];
      // Only with a keeper: it parses kept records, which a plain start has none of to read.
      const { restoreLoaded } = await import('./restoreLoaded.js');
      models.push(...(await restoreLoaded({ records, config, devices: devices.map((d) => d.uuid), started, log })));
      await dropUnplanned(keeper.socket, records, plannedShards(devices, plan, config, models), log);
    }
    return { plan, devices, visibleDevices: visible, socketDir, locks, fill, keeper, models };
  } catch (err) {
    unlockDevices();
    removeSocketDirIfCreated(socketDir);
    throw err;
  }
});

/** What the keeper holds, asked once for the restore and the drops of this start; undefined when it does not answer. */
async function listKept(socket: string, log: Logger) {
  try {
    return await new KeeperClient(socket).list();
  } catch (err) {
    // Most often no keeper answers at all, which the keeper link has already warned of.
    log.debug({ keeper: socket, reason: (err as Error).message }, 'could not list what the keeper holds: no model loaded at run time is restored, and shards no model of this start plans stay kept until its adoption window ends');
    return undefined;
  }
}

/** Every rank shard this node starts with, on its device: the node's own model's and each other model's. */
function plannedShards(devices: DeviceSlot[], plan: CheckpointPlan, config: NodeConfig, models: PlannedModel[]): ShardKey[] {
  return [...shardsOf({ devices, plan, placement: config }), ...models.flatMap((m) => shardsOf(m))];
}
