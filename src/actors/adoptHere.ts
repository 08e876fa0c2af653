// A restart's fast path (issue 33): a rank whose shard the keeper holds adopts it on the main
// thread, with no worker thread and no device context. On the host backend the shard is the
// keeper's sealed memfds, which the host device maps and serves as they are; the checks are the
// worker's own (adoptKept: the record's fields, arena and the files' stat identity, then verify),
// and so are the rank's later steps (keep, drop, release, stop: the same rank worker machine, run
// here). A rank with nothing to adopt, or whose record is refused, starts its worker and loads
// from the checkpoint as before (rankActor.ts).
//
// A cuda rank with descriptor handles (--cuda-handles fd) takes the same path with a device whose
// context is deferred (NativeDeviceOptions.deferContext): it holds the VMM descriptors without
// importing them, exports them as they came, and reports LOADED with descriptors 'checking', so
// the node says READY with no CUDA context made for it. The one check that needs a context (each
// descriptor imports and maps as this GPU's allocation of the planned size: what a client's own
// import does) runs right after, on a libuv thread (checkDescriptors below); until it has passed
// no client gets a descriptor (get_segment_fds waits for it, src/serve/rankService.ts). A failed
// check drops the kept shard and fails the rank by name: the node exits 1 and its next start
// loads from the checkpoint (docs/keeper.md, "A restart that adopts").
//
// Not on this path: a cuda rank with legacy IPC handles (nothing of it is kept), a rank that
// awaits admission (a model loaded beside others, judged on its device's free memory first), and
// a version a writer committed (it adopts its written segments on the main thread too, by
// adoptWrittenHere below: on the host backend, and on cuda with descriptors).
import { serializeError, WeightdError } from '../errors.js';
import { DeviceHandle } from '../native/deviceHandle.js';
import type { NotAdopted, Post, RankWorkerData } from '../models/rankMessages.js';
import { rankKeeping, rankPhases, type RankPhases } from './rankPhases.js';
import { startRankMachine } from './runRankPhases.js';

/** Whether this rank may adopt on the main thread (see the header for those that may not). */
export function adoptsHere(data: RankWorkerData): boolean {
  // The handle types a keeper holds (rankKeeping.ts handleTypeFor), decided without loading it.
  const keepable = data.device.backend === 'host' || data.cudaHandles === 'fd';
  return data.keeper !== undefined && keepable && data.awaitAdmission !== true && data.written === undefined;
}

/** The adopted rank, stepped on this thread. */
export interface RankHere {
  send: ReturnType<typeof startRankMachine>['send'];
}

/**
 * Takes and adopts this rank's kept shard here. The rank, running, once adopted; otherwise
 * undefined (nothing kept, or the keeper failed: logged) or NotAdopted (its record was refused and
 * dropped), with nothing left open: the caller starts the worker, which loads from the checkpoint.
 */
export async function adoptHere(data: RankWorkerData, post: Post, stopped: () => void): Promise<RankHere | NotAdopted | undefined> {
  const { adoptKept, handleTypeFor } = await rankKeeping();
  const cuda = data.device.backend === 'cuda';
  const device = new DeviceHandle(data.device.backend, data.device.index, { uuid: data.device.uuid, ...(cuda ? { cudaHandles: data.cudaHandles, deferContext: true } : {}) });
  let taken;
  try {
    taken = await adoptKept(device, data, data.keeper!, handleTypeFor(data), post);
  } finally {
    if (taken === undefined || 'refused' in taken) await device.free();
  }
  if (taken === undefined || 'refused' in taken) return taken;
  const adopted = { ...taken, source: { ...taken.source, thread: 'main' as const }, ...(cuda ? { descriptors: 'checking' as const } : {}) };
  const phases: RankPhases = {
    ...rankPhases,
    open(_, postHere) {
      postHere({ type: 'DEVICE', info: device.info() });
      return device;
    },
    adopt: () => adopted,
    async export(deviceHere, resident, postHere) {
      const segments = await rankPhases.export(deviceHere, resident, postHere);
      if (resident.descriptors === 'checking') void checkDescriptors(deviceHere, data, postHere);
      return segments;
    },
  };
  return startRankMachine(phases, data, post, stopped);
}

/**
 * Whether this rank is a version a writer just committed, whose segments this process holds: on
 * the host backend its sealed memfds (opened anew read-only by path), on cuda with descriptors
 * its own allocations (the update's finals, the base's shared ones). Starting a worker thread for
 * it was most of a commit's time past its copies and digests (issue 31: on the development VM, 60
 * to 120 ms of a host commit's publication under load), and it needs none: it adopts here. (A
 * written version restored at a start has no segments here: the keeper holds them, adoptHere.)
 */
export function adoptsWrittenHere(data: RankWorkerData): boolean {
  if (data.device.backend === 'host') return data.written?.segmentPaths !== undefined;
  return data.cudaHandles === 'fd' && data.written?.segmentFds !== undefined;
}

/**
 * Adopts a committed version's segments here (the rank's own steps, run on this thread). They are
 * the planned sizes by construction (the update desk made or shared them). On cuda no client waits
 * for a check of the descriptors: the device maps them right after the export, on a libuv
 * thread, for the daemon's own reads (queued after the mapping), off the commit's reply. Mapping
 * them also makes the device retain the GPU's primary context, which must stay made while the
 * version serves: once the checkpoint's version drained, a written version whose device mapped
 * nothing left no holder, and every update call made and destroyed the context again (on an H100,
 * 2026-12-06 16:02, pulls of 8 GB took 400 ms instead of 30: bench/gpu/results/2026-12-06-h100-prepared-pulls).
 * The host device maps its memfds as it adopts them, as a worker's would.
 */
export function adoptWrittenHere(data: RankWorkerData, post: Post, stopped: () => void): RankHere {
  const cuda = data.device.backend === 'cuda';
  const device = new DeviceHandle(data.device.backend, data.device.index, { uuid: data.device.uuid, ...(cuda ? { cudaHandles: 'fd' as const, deferContext: true } : {}) });
  const phases: RankPhases = {
    ...rankPhases,
    open(_, postHere) {
      // Adoptable: its segments exist already, so it takes no new memory (as rankPhases.open says).
      postHere({ type: 'DEVICE', info: device.info(), adoptable: true });
      return device;
    },
    async adopt(deviceHere, dataHere, postHere) {
      const adopted = await rankPhases.adopt(deviceHere, dataHere, postHere);
      return adopted && !('refused' in adopted) ? { ...adopted, source: { from: 'writer', thread: 'main' } } : adopted;
    },
    async export(deviceHere, resident, postHere) {
      const segments = await rankPhases.export(deviceHere, resident, postHere);
      if (cuda) {
        deviceHere.checkAdopted().catch((err: unknown) => {
          if (!deviceHere.freeing) postHere({ type: 'FAILED', error: serializeError(err) });
        });
      }
      return segments;
    },
  };
  return startRankMachine(phases, data, post, stopped);
}

/**
 * The check deferred past READY: imports and maps the held descriptors (making the device's
 * context), then says how it went. A rank stopped or released meanwhile (its device freeing) says
 * nothing: its descriptors are closed, and no one is waiting for them.
 */
async function checkDescriptors(device: DeviceHandle, data: RankWorkerData, post: Post): Promise<void> {
  const started = performance.now();
  try {
    await device.checkAdopted();
  } catch (err) {
    if (device.freeing) return;
    const error = new WeightdError(
      'E_ADOPT_CHECK_FAILED',
      `rank ${data.globalRank}: the descriptors the keeper held for it are not ${data.device.uuid}'s allocations of the planned sizes (${(err as Error).message}); ` +
        'no client was given them. The rank fails and its kept shard is dropped, so the next start loads it from the checkpoint',
      { device: data.device.uuid, cause: (err as { code?: string }).code },
    );
    // Dropped first: a node that restarts at once must not find the same descriptors kept.
    await (await rankKeeping()).dropKept(data, data.keeper!).catch(() => undefined);
    post({ type: 'DESCRIPTORS_CHECKED', error: serializeError(error) });
    // A turn later: the get_segment_fds waiting for the check write their refusal before the
    // rank's failure fails the node, which closes its sockets.
    await new Promise((resolve) => setImmediate(resolve));
    post({ type: 'FAILED', error: serializeError(error) });
    return;
  }
  if (device.freeing) return;
  const checkMs = Math.round(performance.now() - started);
  post({ type: 'LOG', level: 'info', msg: `rank ${data.globalRank} checked its adopted descriptors in ${checkMs} ms, off the path to READY (the device made its CUDA context for it)`, fields: { checkMs } });
  let info;
  try {
    info = device.info();
  } catch {
    // Busy with a call queued after the check (a read): the status keeps "not probed yet".
  }
  post({ type: 'DESCRIPTORS_CHECKED', ...(info ? { info } : {}) });
}
