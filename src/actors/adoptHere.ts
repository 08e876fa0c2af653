// A restart's fast path (issue 33): a rank whose shard the keeper holds adopts it on the main
// thread, with no worker thread and no device context. On the host backend the shard is the
// keeper's sealed memfds, which the host device maps and serves as they are; the checks are the
// worker's own (adoptKept: the record's fields, arena and the files' stat identity, then verify),
// and so are the rank's later steps (keep, drop, release, stop: the same rank worker machine, run
// here). A rank with nothing to adopt, or whose record is refused, starts its worker and loads
// from the checkpoint as before (rankActor.ts).
//
// Not on this path: a cuda rank (adopting VMM descriptors imports them into a CUDA context, which
// the worker owns), a rank that awaits admission (a model loaded beside others, judged on its
// device's free memory first), and a version a writer committed (it adopts its written segments).
import { DeviceHandle } from '../native/deviceHandle.js';
import type { NotAdopted, Post, RankWorkerData } from '../models/rankMessages.js';
import { rankKeeping, rankPhases, type RankPhases } from './rankPhases.js';
import { startRankMachine } from './runRankPhases.js';

/** Whether this rank may adopt on the main thread (see the header for those that may not). */
export function adoptsHere(data: RankWorkerData): boolean {
  return data.keeper !== undefined && data.device.backend === 'host' && data.awaitAdmission !== true && data.written === undefined;
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
  const { adoptKept } = await rankKeeping();
  const device = new DeviceHandle('host', data.device.index, { uuid: data.device.uuid });
  let taken;
  try {
    taken = await adoptKept(device, data, data.keeper!, 'memfd', post);
  } finally {
    if (taken === undefined || 'refused' in taken) await device.free();
  }
  if (taken === undefined || 'refused' in taken) return taken;
  const adopted = { ...taken, source: { ...taken.source, thread: 'main' as const } };
  const phases: RankPhases = {
    ...rankPhases,
    open(_, postHere) {
      postHere({ type: 'DEVICE', info: device.info() });
      return device;
    },
    adopt: () => adopted,
  };
  return startRankMachine(phases, data, post, stopped);
}
