// A rank's load as a sequence of named phases (open, adopt, allocate, fill, export, keep), which
// runRankPhases.ts runs in order on the rank's worker thread: a worker module other than
// src/actors/rankWorker.ts (a test's fixture that fails at one phase on purpose) runs this same
// code around the phase it replaces.
import { checkFileIdentities } from '../files/fileIdentity.js';
import { WeightdError } from '../errors.js';
import { addon, type SegmentExport } from '../native/addon.js';
import { DeviceHandle, type FillResult } from '../native/deviceHandle.js';
import type { Adopted, NotAdopted, Post, RankWorkerData, Resident } from '../models/rankMessages.js';

export type { Post };

/**
 * The keeper's side of a rank, loaded only with a keeper (data.keeper): a rank without one never
 * loads it, nor the zod schema of its kept record, on its worker's start.
 */
export const rankKeeping = () => import('./rankKeeping.js');

type Awaitable<T> = T | Promise<T>;

/** A rank's load, in the order the worker runs it. */
export interface RankPhases {
  /** Opens the device (a CUDA context, or the host backend) and reports it. */
  open(data: RankWorkerData, post: Post): Awaitable<DeviceHandle>;
  /**
   * With a keeper (data.keeper): adopts the segments it holds for this rank, which then skips
   * allocate and fill. Undefined when there is nothing to adopt; NotAdopted when what it held was refused.
   */
  adopt(device: DeviceHandle, data: RankWorkerData, post: Post): Awaitable<Adopted | NotAdopted | undefined>;
  allocate(device: DeviceHandle, data: RankWorkerData): Awaitable<void>;
  fill(device: DeviceHandle, data: RankWorkerData, post: Post): Awaitable<FillResult>;
  /**
   * Checks, once the bytes are resident (filled or adopted), that the checkpoint files are still
   * the ones planned (src/files/fileIdentity.ts): a rank never reports loaded, so never serves nor
   * lets its node say it is ready, with bytes of files that changed meanwhile.
   */
  verify(data: RankWorkerData): Awaitable<void>;
  /** Exports the segments and reports the rank loaded; the worker then serves until told otherwise. */
  export(device: DeviceHandle, resident: Resident, post: Post): Awaitable<SegmentExport[]>;
  /** With a keeper: hands it the exported segments, and the full digests, so that they outlive this daemon. */
  keep(data: RankWorkerData, segments: SegmentExport[], digests: readonly string[], post: Post): Awaitable<void>;
}

export const rankPhases: RankPhases = {
  async open(data, post) {
    const device = new DeviceHandle(data.device.backend, data.device.index, { uuid: data.device.uuid, cudaHandles: data.cudaHandles });
    // A rank judged against free memory before it allocates is not charged for what it will
    // adopt: on a GPU full of kept weights (a restart) its shard is most of what is in use.
    // A written version's segments exist already: it takes no new memory either.
    const adoptable = data.written !== undefined || (data.awaitAdmission && data.keeper ? await (await rankKeeping()).keptShardAdoptable(data, data.keeper) : false);
    post({ type: 'DEVICE', info: device.info(), ...(adoptable ? { adoptable } : {}) });
    return device;
  },
  async adopt(device, data, post) {
    if (data.written?.segmentPaths) return adoptWritten(device, data, { segmentPaths: data.written.segmentPaths, segmentFds: data.written.segmentFds });
    if (!data.keeper) return undefined;
    // Asked already on the main thread (adoptHere.ts), which logged the keeper's answer: nothing to
    // take. Answered without loading the keeper's side, which the thread would otherwise load
    // between its device and its allocation (50-90 ms on the development VM: its modules and zod's).
    if (data.keeperAsked) return data.keeperAsked.refused !== undefined ? { refused: data.keeperAsked.refused } : undefined;
    const { adoptKept, handleTypeFor } = await rankKeeping();
    const adopted = await adoptKept(device, data, data.keeper, handleTypeFor(data), post);
    // A written version restored at a start (src/actors/restoreWritten.ts) has no file to load from.
    if (data.written && (adopted === undefined || 'refused' in adopted)) {
      const why = adopted === undefined ? 'the keeper no longer holds it (its log says why)' : adopted.refused;
      throw new WeightdError('E_NOT_KEPT', `written version ${data.keeper.written?.version ?? '?'} of model "${data.keeper.written?.name ?? '?'}" cannot be restored: ${why}; no checkpoint file holds its bytes, so it is not served`);
    }
    return adopted;
  },
  allocate(device, data) {
    // Each backend checks its free memory before allocating and names the shortfall.
    return device.allocate(data.plan.segments);
  },
  fill(device, { plan, fill }, post) {
    return device.fill(plan.files, plan.ops, plan.totalBytes, { ...fill, zeroRanges: plan.zeroRanges, tensorRanges: plan.contentTensors.ranges }, (p) => post({ type: 'PROGRESS', ...p }));
  },
  verify({ files, globalRank }) {
    return checkFileIdentities(files, `while rank ${globalRank} loaded`, 'what it read is not served. Load again once the directory is complete');
  },
  export(device, { bytes, seconds, source, digests, descriptors }, post) {
    const segments = device.exportSegments();
    post({ type: 'LOADED', info: device.info(), segments, bytes, seconds, source, digests, ...(descriptors ? { descriptors } : {}) });
    return segments;
  },
  async keep(data, segments, digests, post) {
    if (data.keeper) await (await rankKeeping()).keepSegments(data, data.keeper, segments, digests, post);
  },
};

/**
 * A version a writer committed (src/serve/updateDesk.ts): its sealed segments, opened anew here
 * read-only (the device owns these descriptors from adopt on; the desk closes its own once the
 * version serves or failed), so no descriptor the rank serves can write. cuda: the final
 * allocations' descriptors, duplicated (no path opens a VMM export anew; src/serve/cudaUpdateSegments.ts).
 */
async function adoptWritten(device: DeviceHandle, data: RankWorkerData, written: { segmentPaths: string[]; segmentFds?: number[] }): Promise<Adopted> {
  const started = performance.now();
  const fds: number[] = [];
  try {
    if (written.segmentFds) for (const fd of written.segmentFds) fds.push(addon().dupFd(fd));
    else for (const path of written.segmentPaths) fds.push(addon().openReadOnly(path));
  } catch (err) {
    for (const fd of fds) addon().closeFd(fd);
    throw err;
  }
  await device.adopt(fds, data.plan.segments, data.written!.segmentMemory);
  // rekeep: a commit's segments are no keeper's yet; with --keeper the keep phase hands them over.
  return { bytes: data.plan.totalBytes, seconds: (performance.now() - started) / 1000, source: { from: 'writer', thread: 'worker' }, rekeep: true, digests: data.written!.digests };
}
