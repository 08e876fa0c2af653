// First step of a node: plan its checkpoints (parse, validate, shard, fingerprint, in a piscina
// pool), every model it starts with (the first on the devices its group forms over), and pick
// this node's devices.
// Nothing is allocated yet, so every error here costs seconds, not minutes.
import { fromPromise } from 'xstate';
import type { Logger } from '../log.js';
import { errorCode, WeightdError } from '../errors.js';
import { refuseSameCheckpoint } from '../models/alreadyLoadedError.js';
import { localDevices } from '../native/devices.js';
import { dropUnplanned } from '../keeper/dropUnplanned.js';
import { KeeperClient } from '../keeper/keeperClient.js';
import { shardsOf } from '../models/shardsOf.js';
import { acquireDeviceLock, type DeviceLock } from '../wire/deviceLock.js';
import { checkSocketPathLength, removeSocketDirIfCreated, resolveSocketDir, socketPathFor } from '../wire/socketDir.js';
import { VERSION } from '../version.js';
import { planModel, readKeptPlansAhead } from '../models/planModel.js';
import type { PrepareInput, Prepared } from '../machines/supervisorActors.js';

export const prepareNode = fromPromise<Prepared, PrepareInput>(async ({ input, signal }) => {
  const { config, log } = input;
  // Asked before planning: a model whose shards it holds takes its plan from there, reading no
  // safetensors header (src/keeper/keptPlan.ts); the ranks take their shards next. Asked while the
  // devices are probed (cuInit: ~100 ms on an H100 host), with the modules that read its answer,
  // and the first model's kept plan read meanwhile too (all of it but the pick by device).
  const keeperSocket = input.keeper?.socket;
  const writer = `weightd ${VERSION}`;
  const listed = input.keeper?.ready.then(() => Promise.all([listKept(keeperSocket!, log), import('../keeper/keptRecord.js')]).then(([records]) => records));
  const keptAhead = listed?.then((records) => (records ? readKeptPlansAhead(config.models[0]!, config, { records, writer }) : undefined));
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
    const keeper = input.keeper && { socket: input.keeper.socket, model: config.models[0].modelDir, writer, earlierKeeper: new Int32Array(new SharedArrayBuffer(4)) };
    const kept = keeper ? await keptAhead : undefined;
    // The first model is placed on the whole group, over the devices just locked.
    const first = await planModel(config.models[0]!, config, log, devices, kept);
    const models = [first, ...(await Promise.all(config.models.slice(1).map((spec) => planModel(spec, config, log, undefined, kept))))];
    refuseSameCheckpoint(models.map((m) => ({ ...m.spec, fingerprint: m.plan.fingerprint })));
    if (signal.aborted) throw new WeightdError('E_STOPPED', 'stopped while planning');
    signal.removeEventListener('abort', unlockDevices);
    for (const lock of locks) input.servers.holdLock(lock);
    if (keeper && kept) {
      const started = models.map((m) => ({ name: m.spec.name, fingerprint: m.plan.fingerprint }));
      // Only with a keeper: it parses kept records, which a plain start has none of to read.
      const { restoreLoaded } = await import('./restoreLoaded.js');
      models.push(...(await restoreLoaded({ kept, config, devices: devices.map((d) => d.uuid), started, log })));
      const { restoreWritten } = await import('./restoreWritten.js');
      const written = restoreWritten({ records: kept.records, planned: models, devices: devices.map((d) => d.uuid), log });
      await dropUnplanned(keeper.socket, kept.records, [...models, ...written.models].flatMap((m) => shardsOf(m)), log);
      return { devices, visibleDevices: visible, socketDir, locks, keeper, models, written };
    }
    return { devices, visibleDevices: visible, socketDir, locks, keeper, models };
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
    const consequence = 'no model loaded at run time and no written version is restored, and shards no model of this start plans stay kept until its adoption window ends';
    // Most often no keeper answers at all (E_CONNECT), which the keeper link has already warned
    // of. One that took the request and failed it is a warning of its own: what it holds is lost
    // to this start (issue 31).
    const code = errorCode(err);
    if (code === 'E_CONNECT') log.debug({ keeper: socket, reason: (err as Error).message }, `could not list what the keeper holds: ${consequence}`);
    else log.warn({ keeper: socket, code, reason: (err as Error).message }, `the keeper took the LIST request and failed it (${(err as Error).message}): ${consequence}`);
    return undefined;
  }
}
