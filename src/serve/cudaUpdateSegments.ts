// The cuda side of an update (docs/weight-updates.md, "cuda"): what updateDesk.ts does with
// memfds on the host backend, done with VMM allocations exported as descriptors
// (--cuda-handles fd). CUDA has no seal, so the daemon does not trust a writer to unmap: the
// writer writes *staging* allocations (device-to-device copies of the base's segments), and the
// commit copies them into *final* allocations that no writer is handed (clients map them
// read-only where the driver allows; any importer of their descriptor could map them read-write).
// Only the finals are served; a writer that still maps its staging writes memory nobody reads.
import { ServeError } from '../errors.js';
import { addon, type CommitTimings, type CudaDigested, type PullCopyTimings } from '../native/addon.js';
import { packCommitCopies, packTensorRanges, packZeroRanges, type CommitCopy, type PackedTensorRanges } from '../native/fillRecords.js';
import type { TensorRange, ZeroRange } from '../checkpoint/types.js';
import { DEFAULT_DIGESTS_ON } from '../native/fillPolicy.js';
import type { RankService } from './rankService.js';

/**
 * Refuses an update of a cuda rank served with legacy IPC handles: those cannot be handed to
 * another process writable, nor adopted by a version's ranks, so a writer needs descriptors.
 */
export function refuseUnlessCudaFd(service: RankService): void {
  const { rank } = service;
  const legacy = rank.segments.filter((s) => s.handle !== 'cuda-fd' || s.fd === undefined);
  if (legacy.length === 0) return;
  throw new ServeError(
    'E_UPDATE_UNSUPPORTED',
    `model "${rank.name}" serves on GPU ${rank.device.index} with legacy CUDA IPC handles (--cuda-handles ipc), which a writer cannot be given; ` +
      'restart the daemon with --cuda-handles fd to update it (docs/weight-updates.md)',
    { model: rank.name, backend: 'cuda', cudaHandles: 'ipc' },
  );
}

/** A writable staging copy of the rank's segment at `index` (a fresh allocation, its descriptor the caller's). */
export function stageSegment(service: RankService, index: number): Promise<number> {
  const { rank } = service;
  const s = rank.segments[index]!;
  return addon().cudaStagingCopy(rank.device.index, s.fd!, s.bytes);
}

/** The desk's own reference to a segment shared with the base (the base's descriptor, duplicated: no path reopens a VMM export). */
export function shareSegment(service: RankService, index: number): number {
  return addon().dupFd(service.rank.segments[index]!.fd!);
}

/** One pull_tensors request's work, as cudaPull.ts batchPlan makes it. */
export interface BatchPlan {
  /** Its tensors as recordPulls records them (cudaPull.ts Pull's `tensors`), their sources numbered as in `sources`. */
  pulled: Map<string, { source: number; offset: number }>;
  /** The IPC handles its tensors use, decoded. */
  sources: Buffer[];
  /** The copies of its tensors from them (source k + 1: `sources[k]`). */
  copies: CommitCopy[];
  /** The segments they write, each needing a final. */
  segments: boolean[];
  /** The bytes of those segments no tensor holds, written as zeros. */
  zeros: ZeroRange[];
  /** The rank's tensors (by the layout's order) it digests once copied, and their ranges (`file`: the segment's position). */
  digested: { index: number; range: TensorRange }[];
}

/**
 * A pull's early copies (cudaPull.ts batchPlan) into the finals of the segments the request
 * writes: `finals[segment]` where made already, else fresh ones made by the call, each segment's
 * copies and zeros queued as soon as it is made (the GPU copies one while the next is allocated),
 * and the digests of the plan's `digested` tensors hashed behind their copies, where the rank's
 * fill hashed (as commitCudaPart; on the GPU, a batch of segments at a time while the next ones
 * are made). Resolves once they are done, with the descriptors of the finals it made (the
 * caller's; -1 elsewhere): the daemon's own allocations, handed to no other process.
 */
export async function copyPulled(
  service: RankService,
  finals: number[],
  plan: BatchPlan,
  threads: number,
  prepared?: number,
): Promise<{ fds: number[]; timings: PullCopyTimings } & CudaDigested> {
  const { rank } = service;
  const bytes = rank.segments.map((s) => s.bytes);
  const ranges = packTensorRanges(plan.digested.map((d) => d.range));
  const digestOn = rank.digestOn ?? DEFAULT_DIGESTS_ON;
  const pulled = await addon().cudaPullCopies(
    rank.device.index,
    finals,
    plan.segments,
    bytes,
    plan.sources,
    packCommitCopies(plan.copies),
    packZeroRanges(plan.zeros),
    ranges,
    threads,
    digestOn,
    prepared,
  );
  logCpuDigests(service, pulled);
  return pulled;
}

/**
 * A pull's finals made at begin (begin_update's `prepare`): one for each segment of `which`,
 * made and mapped in the daemon (native/cuda_update_segments.h, cudaPrepareFinals) and kept so
 * under `id` until dropped (cudaDropPrepared), so the pull's copies neither make nor map them.
 * `fds`: their descriptors (the caller's), -1 elsewhere.
 */
export function prepareFinals(service: RankService, which: boolean[]): Promise<{ id: number; fds: number[]; timings: { allocateMs: number; nativeMs: number } }> {
  const { rank } = service;
  return addon().cudaPrepareFinals(rank.device.index, which, rank.segments.map((s) => s.bytes));
}

/** Says where a commit's or pull's digests were hashed on the CPU though the GPU was asked. */
function logCpuDigests(service: RankService, digested: CudaDigested): void {
  if (!digested.gpuDigestUnavailable) return;
  service.log.info({ model: service.rank.name, globalRank: service.rank.globalRank, why: digested.gpuDigestUnavailable }, 'update digests hashed on the CPU, not the GPU');
}

/**
 * Commits a rank's part: copies each staging allocation (`copied`) into a final one, or under a
 * pull (`pull`) fills the finals its early copies wrote (`finals`) with the base's bytes of the
 * tensors no pull wrote (`copies`), and digests `ranges` over what the version will serve, where the
 * rank's fill hashed (ServedRankData.digestOn: on the GPU where the addon has the digest kernel,
 * the log says why not; 'cpu' on the CPU). Resolves with the finals' descriptors (the caller's; -1
 * where shared), the digests and where they were hashed.
 */
export async function commitCudaPart(
  service: RankService,
  fds: number[],
  copied: boolean[],
  ranges: PackedTensorRanges,
  threads: number,
  pull?: { finals: number[]; copies: CommitCopy[]; prepared?: number },
): Promise<{ fds: number[]; timings: CommitTimings } & CudaDigested> {
  const { rank } = service;
  const bytes = rank.segments.map((s) => s.bytes);
  const digestOn = rank.digestOn ?? DEFAULT_DIGESTS_ON;
  const committed = pull
    ? await addon().cudaPullCommit(rank.device.index, fds, copied, bytes, pull.finals, [], packCommitCopies(pull.copies), ranges, threads, digestOn, pull.prepared)
    : await addon().cudaCommitCopies(rank.device.index, fds, copied, bytes, ranges, threads, digestOn);
  logCpuDigests(service, committed);
  return committed;
}
