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
import { batchPlan, commitGaps, pulledSegments, recordPulls, refuseUnlessPullable, rehashedUnderPull, type Pull, type PulledTensor } from './cudaPull.js';
import type { Caller } from './leaseTable.js';
import type { RankService } from './rankService.js';
import { tensorsByName } from './tensorsByName.js';

/** Plans one connection may hold open at once, and the node's sockets together: each holds the writer's memory open and GPU buffers. */
export const MAX_PLANS_PER_CONNECTION = 4;
export const MAX_PLANS = 64;
/** What one plan may name in all (over several requests: open_pull_plan's `more`), and the node's plans together (open and being named): each tensor costs the daemon memory while its plan lives. */
export const MAX_PLAN_TENSORS = 262_144;
export const MAX_PLAN_SOURCES = 65_536;
export const MAX_NODE_PLAN_TENSORS = 1_048_576;

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

/** A plan named over several requests, until its last part: what its parts named so far, checked as they came. */
interface PlanParts {
  connectionId: number;
  model: string;
  device: string;
  /** The parts recorded as a pull records them (its sources, each handle once): a part that names a tensor again, or one the layout lacks, is refused whole. */
  checked: Pull;
  /** Every part's tensors, their sources indexing `checked.sources`. */
  tensors: PulledTensor[];
}

export class PullPlanDesk {
  readonly #bounds: { planTensors: number; nodeTensors: number };
  readonly #plans = new Map<string, PullPlan>();
  /** Plans being opened (their native part not made yet), by connection: counted against the bounds, closed if their connection ends first. */
  readonly #opening = new Map<number, number>();
  /** Plans whose parts are coming (open_pull_plan's `more`), by id: counted against the bounds, dropped with their connection. */
  readonly #parts = new Map<string, PlanParts>();

  /** `bounds`: MAX_PLAN_TENSORS and MAX_NODE_PLAN_TENSORS unless given (tests give smaller ones). */
  constructor(bounds: { planTensors?: number; nodeTensors?: number } = {}) {
    this.#bounds = { planTensors: bounds.planTensors ?? MAX_PLAN_TENSORS, nodeTensors: bounds.nodeTensors ?? MAX_NODE_PLAN_TENSORS };
  }

  /**
   * open_pull_plan: checks `tensors` (each a tensor of `service`'s layout, whole, once; sources of
   * the request) as pull_tensors does, then opens the writer's memory and makes the copies' and
   * digests' resources, kept until the connection ends. A plan of more tensors than one request
   * holds comes in parts: each but the last with `more` (the first names no `plan`; the others
   * name the first's), each checked as it comes; the last makes the plan of them all.
   */
  async open(
    service: RankService,
    caller: Caller,
    device: string,
    sources: readonly string[],
    tensors: readonly PulledTensor[],
    isConnected: () => boolean,
    part: { more?: boolean; plan?: string } = {},
  ): Promise<
    | { pending: { id: string; model: string; tensors: number; sources: number } }
    | { plan: PullPlan; sources: number; timings: { openMs: number; setupMs: number; moduleMs: number; nativeMs: number }; gpuDigestUnavailable: string }
  > {
    const { rank } = service;
    refuseUnlessPullable(service, device, undefined);
    const earlier = part.plan === undefined ? undefined : this.#partsOf(part.plan, caller, service, device);
    if (!earlier) this.#refuseOverBounds(caller, rank.name);
    const parts: PlanParts = earlier ?? { connectionId: caller.connectionId, model: rank.name, device, checked: { sources: [], sourceIndex: new Map(), tensors: new Map() }, tensors: [] };
    const { checked } = parts;
    const { planTensors, nodeTensors } = this.#bounds;
    if (parts.tensors.length + tensors.length > planTensors || checked.sources.length + sources.length > MAX_PLAN_SOURCES) {
      throw new ServeError(
        'E_BAD_REQUEST',
        `a pull plan names at most ${planTensors} tensors of at most ${MAX_PLAN_SOURCES} sources; this part would make it ${parts.tensors.length + tensors.length} of up to ${checked.sources.length + sources.length}: open several plans`,
        { model: rank.name },
      );
    }
    const named = this.#namedTensors();
    if (named + tensors.length > nodeTensors) {
      throw new ServeError(
        'E_TOO_MANY_PULL_PLANS',
        `the node's pull plans name ${named} tensors, and this part ${tensors.length} more, past the ${nodeTensors} they may name together; close a plan's connection, or pull with pull_tensors`,
        { model: rank.name, limit: nodeTensors },
      );
    }
    recordPulls(service, checked, sources, tensors);
    for (const t of tensors) parts.tensors.push({ ...t, source: checked.sourceIndex.get(sources[t.source]!)! });
    const id = part.plan ?? randomBytes(16).toString('hex');
    if (part.more) {
      this.#parts.set(id, parts);
      return { pending: { id, model: parts.model, tensors: parts.tensors.length, sources: checked.sources.length } };
    }
    this.#parts.delete(id);
    return { ...(await this.#make(service, caller, checked.sources, parts.tensors, isConnected, id)), sources: checked.sources.length };
  }

  /** The parts of plan `id` that this connection is naming, for this model and GPU; E_NO_PULL_PLAN otherwise. */
  #partsOf(id: string, caller: Caller, service: RankService, device: string): PlanParts {
    const parts = this.#parts.get(id);
    if (!parts || parts.connectionId !== caller.connectionId) {
      throw new ServeError(
        'E_NO_PULL_PLAN',
        `pull plan ${id.slice(0, 8)}… is not being opened on this connection (its first part, with more, opens it; a plan's parts come on one connection, before its last part); open_pull_plan again from its first part`,
        { model: service.rank.name },
      );
    }
    if (parts.model !== service.rank.name || parts.device !== device) {
      throw new ServeError('E_NO_PULL_PLAN', `pull plan ${id.slice(0, 8)}… names tensors of model "${parts.model}" on ${parts.device}, not of "${service.rank.name}" on ${device}; send each part of a plan for one model and GPU`, {
        model: service.rank.name,
      });
    }
    return parts;
  }

  /** The tensors the node's plans name, open and being named. */
  #namedTensors(): number {
    let n = 0;
    for (const p of this.#plans.values()) n += p.tensors.size;
    for (const p of this.#parts.values()) n += p.tensors.length;
    return n;
  }

  #refuseOverBounds(caller: Caller, model: string): void {
    const pending = [...this.#parts.values()];
    const mine =
      [...this.#plans.values()].filter((p) => p.connectionId === caller.connectionId).length + (this.#opening.get(caller.connectionId) ?? 0) + pending.filter((p) => p.connectionId === caller.connectionId).length;
    const all = this.#plans.size + [...this.#opening.values()].reduce((a, b) => a + b, 0) + pending.length;
    if (mine >= MAX_PLANS_PER_CONNECTION || all >= MAX_PLANS) {
      throw new ServeError(
        'E_TOO_MANY_PULL_PLANS',
        mine >= MAX_PLANS_PER_CONNECTION
          ? `this connection holds ${mine} pull plans, the most one may (${MAX_PLANS_PER_CONNECTION}): each keeps the writer's memory open; close one's connection, or pull with pull_tensors`
          : `the node holds ${all} pull plans, the most it keeps (${MAX_PLANS}); close a plan's connection, or pull with pull_tensors`,
        { model, limit: mine >= MAX_PLANS_PER_CONNECTION ? MAX_PLANS_PER_CONNECTION : MAX_PLANS },
      );
    }
  }

  /** Opens the writer's memory and makes the native plan of `tensors`, numbered `id`. */
  async #make(
    service: RankService,
    caller: Caller,
    sources: readonly string[],
    tensors: readonly PulledTensor[],
    isConnected: () => boolean,
    id: string,
  ): Promise<{ plan: PullPlan; timings: { openMs: number; setupMs: number; moduleMs: number; nativeMs: number }; gpuDigestUnavailable: string }> {
    const { rank } = service;
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
      id,
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

  /** Whether a connection opened a plan still open, or is naming one's parts (kept open while idle, as a lease's). */
  holds(connectionId: number): boolean {
    return (
      [...this.#plans.values()].some((p) => p.connectionId === connectionId) || this.#opening.has(connectionId) || [...this.#parts.values()].some((p) => p.connectionId === connectionId)
    );
  }

  /** A connection ended: the plans it opened close (the writer's memory, the kernel's resources go after any run in flight), and those it was naming go. */
  connectionClosed(connectionId: number): void {
    for (const [id, parts] of [...this.#parts]) if (parts.connectionId === connectionId) this.#parts.delete(id);
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
  const now = tensorsByName(rank.tensors);
  for (const t of plan.layout) {
    const n = now.get(t.name);
    if (!n) return `tensor "${t.name}" is gone`;
    if (n.segment !== t.segment || n.offset !== t.offset || n.bytes !== t.bytes) return `tensor "${t.name}" lies elsewhere`;
  }
  return rank.tensors.length === plan.layout.length ? undefined : 'it holds other tensors';
}
