// Pull plans (docs/weight-updates.md, "Pull plans"): a trainer names its tensors once
// (open_pull_plan), and each update after pulls them by the plan's number (pull_by_plan). A
// trainer's parameters stay in the same allocations from step to step, so what a pull does before
// its copies is the same every time: checking the names and sizes against the layout, planning the
// copies, opening the writer's memory over IPC, loading the digest kernel and making its buffers and
// streams. On an H100 that was 2-9 ms of a 14 ms update of 8 GB (bench/RESULTS.md, 2026-12-07); a
// plan does it once and keeps it (native/cuda_pull_plans.h) while the connection that opened it lives.
import { randomBytes } from 'node:crypto';
import { ServeError } from '../errors.js';
import type { TensorEntry } from '../checkpoint/types.js';
import { addon } from '../native/addon.js';
import { packCommitCopies, packTensorRanges, packZeroRanges } from '../native/fillRecords.js';
import { DEFAULT_DIGESTS_ON } from '../native/fillPolicy.js';
import type { CommitCopy } from '../native/fillRecords.js';
import { batchPlan, commitGaps, pulledSegments, refuseUnlessPullable, rehashedUnderPull, type Pull, type PulledTensor } from './cudaPull.js';
import type { Caller } from './leaseTable.js';
import type { RankService } from './rankService.js';

/** Plans one connection may hold open at once, and the node's sockets together: each holds the writer's memory open and GPU buffers. */
export const MAX_PLANS_PER_CONNECTION = 4;
export const MAX_PLANS = 64;

/** An open plan: what pull_by_plan records into an update and runs. */
export interface PullPlan {
  id: string;
  connectionId: number;
  pid: number;
  model: string;
  deviceIndex: number;
  /** Its tensors, as a pull_tensors request records them (their sources are the plan's). */
  tensors: Pull['tensors'];
  /** The rank's tensors (by the layout's order) each run digests as it copies, by index. */
  digested: number[];
  /** The native plan's number (cuda_pull_plans.h). */
  native: number;
  /** The layout the plan was made against (its tensors' places); a version's is checked against it once. */
  layout: readonly TensorEntry[];
  segmentBytes: readonly number[];
  fits: WeakSet<readonly TensorEntry[]>;
  /**
   * What the commit of an update that pulls by this plan alone plans from its tensors, the same
   * for every such update of its layout (cudaPull.ts): the segments it writes, the tensors digested
   * again, and the bytes copied from the base at commit.
   */
  commit: { copied: readonly boolean[]; rehash: readonly boolean[]; gaps: readonly CommitCopy[] };
}

export class PullPlanDesk {
  readonly #plans = new Map<string, PullPlan>();
  /** Plans being opened (their native part not made yet), by connection: counted against the bounds, closed if their connection ends first. */
  readonly #opening = new Map<number, number>();

  /**
   * open_pull_plan: checks `tensors` (each a tensor of `service`'s layout, whole, once; sources of
   * the request) as pull_tensors does, then opens the writer's memory and makes the copies' and
   * digests' resources, kept until the connection ends.
   */
  async open(
    service: RankService,
    caller: Caller,
    device: string,
    sources: readonly string[],
    tensors: readonly PulledTensor[],
    isConnected: () => boolean,
  ): Promise<{ plan: PullPlan; timings: { openMs: number; setupMs: number; moduleMs: number; nativeMs: number }; gpuDigestUnavailable: string }> {
    const { rank } = service;
    refuseUnlessPullable(service, device, undefined);
    const mine = [...this.#plans.values()].filter((p) => p.connectionId === caller.connectionId).length + (this.#opening.get(caller.connectionId) ?? 0);
    const all = this.#plans.size + [...this.#opening.values()].reduce((a, b) => a + b, 0);
    if (mine >= MAX_PLANS_PER_CONNECTION || all >= MAX_PLANS) {
      throw new ServeError(
        'E_TOO_MANY_PULL_PLANS',
        mine >= MAX_PLANS_PER_CONNECTION
          ? `this connection holds ${mine} pull plans, the most one may (${MAX_PLANS_PER_CONNECTION}): each keeps the writer's memory open; close one's connection, or pull with pull_tensors`
          : `the node holds ${all} pull plans, the most it keeps (${MAX_PLANS}); close a plan's connection, or pull with pull_tensors`,
        { model: rank.name, limit: mine >= MAX_PLANS_PER_CONNECTION ? MAX_PLANS_PER_CONNECTION : MAX_PLANS },
      );
    }
    const batch = batchPlan(service, sources, tensors);
    // The plan's tensors as a Pull, for the commit's planners below, which read only its tensors.
    const pull: Pull = { sources: [], sourceIndex: new Map(), tensors: batch.pulled };
    this.#opening.set(caller.connectionId, (this.#opening.get(caller.connectionId) ?? 0) + 1);
    let made: Awaited<ReturnType<ReturnType<typeof addon>['cudaOpenPullPlan']>>;
    try {
      made = await addon().cudaOpenPullPlan(
        rank.device.index,
        batch.segments,
        rank.segments.map((s) => s.bytes),
        batch.sources,
        packCommitCopies(batch.copies),
        packZeroRanges(batch.zeros),
        packTensorRanges(batch.digested.map((d) => d.range)),
        rank.digestOn ?? DEFAULT_DIGESTS_ON,
      );
    } finally {
      const left = (this.#opening.get(caller.connectionId) ?? 1) - 1;
      if (left > 0) this.#opening.set(caller.connectionId, left);
      else this.#opening.delete(caller.connectionId);
    }
    if (!isConnected()) {
      this.#closeNative(made.id);
      throw new ServeError('E_DISCONNECTED', `the connection that opened a pull plan of model "${rank.name}" ended while it was made; nothing of it is kept`, { model: rank.name });
    }
    const copied = pulledSegments(service, pull);
    const plan: PullPlan = {
      id: randomBytes(16).toString('hex'),
      connectionId: caller.connectionId,
      pid: caller.pid,
      model: rank.name,
      deviceIndex: rank.device.index,
      tensors: pull.tensors,
      digested: batch.digested.map((d) => d.index),
      native: made.id,
      layout: rank.tensors,
      segmentBytes: rank.segments.map((s) => s.bytes),
      fits: new WeakSet([rank.tensors]),
      commit: { copied, rehash: rehashedUnderPull(service, pull), gaps: commitGaps(service, pull, copied) },
    };
    this.#plans.set(plan.id, plan);
    service.log.info(
      { model: rank.name, globalRank: rank.globalRank, peerPid: caller.pid, tensors: pull.tensors.size, sources: batch.sources.length, timings: made.timings, ...(made.gpuDigestUnavailable ? { gpuDigestUnavailable: made.gpuDigestUnavailable } : {}) },
      "pull plan opened: the writer's tensors are named once, for every update on it",
    );
    const { nativeMs, openMs, setupMs, moduleMs } = made.timings;
    return { plan, timings: { nativeMs, openMs, setupMs, moduleMs }, gpuDigestUnavailable: made.gpuDigestUnavailable };
  }

  /**
   * The plan `id` for an update of `service` by `caller`: a plan of the caller's own process (any
   * of its connections), of the same model and GPU, made against this version's layout (a version
   * written by an update keeps its base's; a checkpoint swapped in may not). E_NO_PULL_PLAN, naming why, otherwise.
   */
  find(id: string, caller: Caller, service: RankService): PullPlan {
    const plan = this.#plans.get(id);
    const { rank } = service;
    if (!plan || plan.pid !== caller.pid) {
      throw new ServeError(
        'E_NO_PULL_PLAN',
        `pull plan ${id.slice(0, 8)}… is not open for this process: it ended with the connection that opened it, or another process opened it; open_pull_plan again`,
        { model: rank.name },
      );
    }
    if (plan.model !== rank.name || plan.deviceIndex !== rank.device.index) {
      throw new ServeError('E_NO_PULL_PLAN', `pull plan ${id.slice(0, 8)}… names tensors of model "${plan.model}" on GPU ${plan.deviceIndex}, not of "${rank.name}" on GPU ${rank.device.index}; open a plan for this model`, {
        model: rank.name,
      });
    }
    if (!plan.fits.has(rank.tensors)) {
      const moved = layoutDifference(plan, rank);
      if (moved) {
        throw new ServeError(
          'E_NO_PULL_PLAN',
          `pull plan ${id.slice(0, 8)}… was made for another layout of model "${rank.name}" (${moved}): the version this update writes over lays its tensors out differently; open a new plan`,
          { model: rank.name },
        );
      }
      plan.fits.add(rank.tensors);
    }
    return plan;
  }

  /** Whether a connection opened a plan still open (kept open while idle, as a lease's). */
  holds(connectionId: number): boolean {
    return [...this.#plans.values()].some((p) => p.connectionId === connectionId) || this.#opening.has(connectionId);
  }

  /** A connection ended: the plans it opened close (the writer's memory, the kernel's resources go after any run in flight). */
  connectionClosed(connectionId: number): void {
    for (const plan of [...this.#plans.values()]) {
      if (plan.connectionId !== connectionId) continue;
      this.#plans.delete(plan.id);
      this.#closeNative(plan.native);
    }
  }

  #closeNative(id: number): void {
    // The native side cannot refuse a close (an unknown number is no error); what it hands its
    // releaser fails, if at all, where nothing waits.
    void addon()
      .cudaClosePullPlan(id)
      .catch(() => {});
  }
}

/** How `rank`'s layout differs from the one `plan` was made for (a tensor moved, resized or gone; a segment's size), or undefined where it fits. */
export function layoutDifference(plan: PullPlan, rank: RankService['rank']): string | undefined {
  if (rank.segments.length !== plan.segmentBytes.length || rank.segments.some((s, i) => s.bytes !== plan.segmentBytes[i])) return 'its segments differ';
  const now = new Map(rank.tensors.map((t) => [t.name, t]));
  for (const t of plan.layout) {
    const n = now.get(t.name);
    if (!n) return `tensor "${t.name}" is gone`;
    if (n.segment !== t.segment || n.offset !== t.offset || n.bytes !== t.bytes) return `tensor "${t.name}" lies elsewhere`;
  }
  return rank.tensors.length === plan.layout.length ? undefined : 'it holds other tensors';
}
