// Updates in progress on this node (docs/weight-updates.md): a writer of the daemon's user asks a
// rank's socket for writable copies of a served version's segments (begin_update), writes them,
// and commits (commit_update); the daemon seals and digests each rank's copies (on cuda, copies
// them into allocations no writer maps first: cudaUpdateSegments.ts), and once every
// local rank of the model committed, hands the sealed segments to the publisher (the model
// control, which serves them as the model's newest version through a model actor). Until then
// nothing of an update is visible, and a connection of it that ends takes all of it away.
import { randomBytes } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { errorCode, receivedCode, ServeError } from '../errors.js';
import { writtenVersionFingerprint, type Fingerprint } from '../checkpoint/fingerprint.js';
import { addon, type CommitTimings, type CudaDigested, type PullCopyTimings } from '../native/addon.js';
import { packTensorRanges } from '../native/fillRecords.js';
import { batchPlan, commitGaps, pulledSegments, recordPulls, refuseUnlessPullable, rehashedUnderPull, type Pull, type PulledTensor } from './cudaPull.js';
import { commitCudaPart, copyPulled, prepareFinals, refuseUnlessCudaFd, shareSegment, stageSegment } from './cudaUpdateSegments.js';
import type { PullPlan } from './pullPlanDesk.js';
import { replicaMismatches } from './replicaDigests.js';
import type { Caller } from './leaseTable.js';
import type { RankService } from './rankService.js';
import { tensorsByName } from './tensorsByName.js';

/** Threads that digest a committed rank (at most 8: a commit should not take every core from the engines). */
const DIGEST_THREADS = Math.min(8, availableParallelism());

/** One local rank of a written version, sealed: what its rank actor adopts. */
export interface WrittenRank {
  globalRank: number;
  localRank: number;
  /** /proc/self/fd paths of the sealed segments, in order: the rank opens its own descriptors of them (read-only) to adopt. */
  segmentPaths: string[];
  /** cuda: the final allocations' descriptors, in order, which the rank duplicates to adopt (no path reopens a VMM export). */
  segmentFds?: number[];
  /** cuda: WrittenRankData.segmentMemory. */
  segmentMemory?: (string | null)[];
  /** Each tensor of the rank's checkpoint layout's digest, in the manifest's order (docs/spec/fingerprint.md §9). */
  digests: string[];
  /** The positions of the segments that are the base's own memfd (not copied): the keeper's record says so. */
  shared: number[];
}

/** A committed update, every local rank sealed: the new version to serve. */
export interface WrittenVersion {
  name: string;
  /** The served version (its model actor's id, ServeOptions.version) whose copy was written. */
  baseVersion: string;
  /** The model's fingerprint and fields (§9); each rank's is rankFingerprint of it. */
  fingerprint: Fingerprint;
  ranks: WrittenRank[];
  /** The fingerprint of the version of its name that was current when the update began (UpdateDesk.currentOf): a version chosen since (a hot swap, a rollback) is not undone by it. */
  currentAtBegin?: string;
}

/** Serves a written version (the model control); resolves with its number once it serves (rejects when it failed: nothing of it stays). */
export type PublishUpdate = (version: WrittenVersion) => Promise<{ version: number }>;

interface Part {
  id: string;
  connectionId: number;
  service: RankService;
  /**
   * One descriptor per segment of the rank, once made: a writable copy for a segment that holds a
   * tensor the writer names, else the base's own sealed memfd opened anew read-only (shared, not
   * copied: its pages are freed once no version's descriptor or mapping holds them). Closed when
   * the update ends, however it ends.
   */
  fds: number[];
  /** Which of `fds` are writable copies (the segments the writer got). */
  copied: boolean[];
  /** Settles once the begin reply that carries them has been sent: they are not closed before. */
  sent: Promise<void>;
  /**
   * Settles once the commit in progress (if any) did: its digests or copies run on the addon's
   * threads, which open `fds` by number, so they are not closed under it (one closed may be
   * another file by the time a thread opens it).
   */
  committing?: Promise<unknown>;
  markSent: () => void;
  digests?: string[];
  /**
   * A pull update (begin_update `source: "pull"`, cuda): nothing is copied at begin (`fds` are the
   * base's own, shared); the writer names its tensors' memory with pull_tensors, and `copied`
   * is decided at commit (the segments holding a pulled tensor).
   */
  pull?: Pull;
  /** The plan a pull update pulled by, when its only pull was by that plan: its commit's plan is the plan's (PullPlan.commit). */
  byPlan?: PullPlan;
  /**
   * A cuda pull's early work (docs/weight-updates.md, "Pulling from the writer's tensors"): each
   * pull_tensors request, once recorded, makes the finals of the segments it writes (`finals`, per
   * segment, -1 until made: the daemon's own allocations, handed to no process and served only once
   * committed) and copies its tensors into them, one request after another (`pulling`), while the
   * writer goes on; the commit waits for what is in flight. The first failure (`pullFailed`) is the
   * commit's answer. An end closes `finals` only once `pulling` settled.
   */
  finals?: number[];
  /**
   * A pull begun with `prepare`: the number under which its finals made at begin stay mapped in
   * the daemon (native/cuda_prepared_finals.h), so its copies go straight into them; dropped once
   * the commit used them or the update ended (the descriptors in `finals` hold the memory).
   */
  prepared?: number;
  pulling?: Promise<void>;
  pullFailed?: unknown;
  /**
   * The pulls' native split summed (`nativeMs` the calls' whole native time, setup included);
   * `queueMs`: their calls' wall time past their native time (the thread pool's queue, the hop
   * back); `prepareMs`: making and mapping the finals at begin (`prepare`), off the pull's path
   * when begun ahead.
   */
  pullTimings?: PullCopyTimings & { queueMs: number; prepareMs?: number };
  /**
   * The digests the early copies made (by the rank's tensor index) of the pulled tensors that share
   * no byte with another (cudaPull.ts batchPlan), and whether any was hashed on the CPU: the commit
   * digests only the rest.
   */
  pullDigests?: Map<number, string>;
  pullHashedOnCpu?: boolean;
}

/** The "update sealed" line's split of a commit that the native timings do not cover, in milliseconds. */
interface CommitRest {
  /** Waiting for a pull's early copies still in flight. */
  waitPullsMs: number;
  /** Planning in JS before the native call: digests to reuse, ranges, copies. */
  planMs: number;
  /** The native call's wall time past its own: the thread pool's queue and the hop back. */
  queueMs: number;
}

interface Update {
  name: string;
  baseVersion: string;
  /** WrittenVersion.currentAtBegin. */
  currentAtBegin: string | undefined;
  /** Global ranks of the base version on this node: all must commit. */
  ranks: number[];
  parts: Map<number, Part>;
  startedAt: number;
  /** Every rank committed: the version is being served, and no connection's end takes it back. */
  publishing: boolean;
  ended: boolean;
}

export class UpdateDesk {
  /** Set by the node once its model control exists; an update committed before is refused. */
  publisher: PublishUpdate | undefined;
  /** Set with it: the fingerprint of the version of a name clients are pointed to now (ModelControl.currentOf). */
  currentOf: ((name: string) => string | undefined) | undefined;
  readonly #updates = new Map<string, Update>();
  /** Descriptors being closed on the addon's threads (#closeAway), until each batch is. */
  readonly #closing = new Set<Promise<void>>();

  /**
   * Settles once every descriptor an update let go of so far is closed. They are closed on the
   * addon's threads, off every reply's path: the last descriptor of a version's memory frees it
   * inside close() (8 GB of GPU memory, or a memfd's pages), which the main thread would otherwise
   * spend before its next reply.
   */
  async closed(): Promise<void> {
    while (this.#closing.size > 0) await Promise.all(this.#closing);
  }

  /** Whether a connection began a part of an update still in progress (kept open while idle, as a lease's). */
  holds(connectionId: number): boolean {
    return this.#parts().some(({ part }) => part.connectionId === connectionId);
  }

  /**
   * begin_update on `service`'s rank: makes writable copies of the segments that hold `tensors`
   * (all when absent) and shares the rest. `version`: the version the service is a rank of;
   * `siblings`: the global ranks of that version on this node. Returns the copies' descriptors and
   * their segments' numbers.
   */
  async begin(
    service: RankService,
    version: string,
    siblings: number[],
    caller: Caller,
    isConnected: () => boolean,
    tensors?: readonly string[],
    pull?: { device: string | undefined; prepare?: boolean },
  ): Promise<{ id: string; fds: number[]; segments: number[]; sent: () => void }> {
    const { rank } = service;
    const name = rank.name;
    if (pull) refuseUnlessPullable(service, pull.device, tensors, pull.prepare === true);
    // A pull copies nothing at begin: which segments it writes is known at commit. Prepared, it
    // makes the finals of the segments holding `tensors` (all without) now, off the reply.
    const copied = pull ? rank.segments.map(() => false) : segmentsToCopy(service, tensors);
    const prepare = pull?.prepare ? segmentsToCopy(service, tensors) : undefined;
    if (!this.publisher) throw new ServeError('E_UPDATE_UNSUPPORTED', `the node is not ready to take an update of model "${name}" yet; begin again once it serves`, { model: name });
    if (rank.backend === 'cuda') refuseUnlessCudaFd(service);
    if (rank.nnodes > 1) {
      throw new ServeError('E_UPDATE_UNSUPPORTED', `model "${name}" spans ${rank.nnodes} nodes; a writer updates a model served by one node (docs/weight-updates.md)`, { model: name, nnodes: rank.nnodes });
    }
    service.refuseUnlessServing();
    let update = this.#updates.get(name);
    const busy = update && (update.baseVersion !== version || update.parts.has(rank.globalRank) || update.publishing);
    if (update && busy) {
      const begun = [...update.parts.keys()];
      throw new ServeError(
        'E_UPDATE_BUSY',
        `model "${name}" has an update in progress (ranks ${begun.join(', ')} begun ${Math.round((Date.now() - update.startedAt) / 1000)} s ago): one update of a model at a time; ` +
          'commit it or end its connections, then begin again',
        { model: name, ranks: begun },
      );
    }
    if (!update) {
      update = { name, baseVersion: version, currentAtBegin: this.currentOf?.(name), ranks: siblings, parts: new Map(), startedAt: Date.now(), publishing: false, ended: false };
      this.#updates.set(name, update);
    }
    let markSent = () => {};
    const sent = new Promise<void>((resolve) => (markSent = resolve));
    const part: Part = {
      id: randomBytes(16).toString('hex'),
      connectionId: caller.connectionId,
      service,
      fds: [],
      copied,
      sent,
      markSent,
      ...(pull ? { pull: { sources: [], sourceIndex: new Map(), tensors: new Map() } } : {}),
    };
    update.parts.set(rank.globalRank, part);
    // The base's descriptors stay open (its release waits) while they are copied.
    const done = service.holdSegmentFds();
    try {
      // Every copied segment at once, on the addon's threads; a shared one is opened (no copy).
      const cuda = rank.backend === 'cuda';
      const made = await Promise.allSettled(
        rank.segments.map((s, i) =>
          copied[i]
            ? cuda
              ? stageSegment(service, i)
              : addon().createWritableCopy(s.fd!, s.bytes, `weightd:update:${name}:r${rank.globalRank}:s${s.segment}`)
            : Promise.resolve().then(() => (cuda ? shareSegment(service, i) : addon().openReadOnly(procPath(s.fd!)))),
        ),
      );
      for (const c of made) if (c.status === 'fulfilled') part.fds.push(c.value);
      const failed = made.find((c) => c.status === 'rejected');
      if (failed) throw failed.reason;
    } catch (err) {
      this.#end(update, `copying rank ${rank.globalRank}'s base segments failed`);
      part.markSent();
      closeAll(part.fds);
      throw err;
    } finally {
      done();
    }
    if (update.ended || !isConnected()) {
      this.#end(update, 'its connection ended while the base was copied');
      // A copy made after the update ended is this call's to close.
      part.markSent();
      closeAll(part.fds);
      throw new ServeError('E_UPDATE_ABORTED', `the update of model "${name}" ended while rank ${rank.globalRank}'s base was copied (a connection of it closed); begin again`, { model: name });
    }
    const segments = rank.segments.map((s) => s.segment).filter((_, i) => copied[i]);
    if (prepare) this.#prepareEarly(update, part, prepare);
    service.log.info(
      {
        model: name, globalRank: rank.globalRank, base: rank.fingerprint, peerPid: caller.pid, copied: segments.length, shared: rank.segments.length - segments.length, pull: !!pull,
        ...(prepare ? { prepared: prepare.filter(Boolean).length } : {}),
      },
      pull ? "update begun: the writer's tensors are pulled at commit" : 'update begun: writable copies of the base handed to the writer',
    );
    return { id: part.id, fds: part.fds.filter((_, i) => copied[i]), segments, sent: part.markSent };
  }

  /**
   * pull_tensors: records where the writer's new bytes of `tensors` lie (`sources`, legacy CUDA IPC
   * handles in base64, indexed by each tensor's `source`), all checked before any is recorded; the
   * commit copies them. Resolves with how many tensors the rank's part pulls so far, of how many.
   */
  pull(id: string, caller: Caller, sources: readonly string[], tensors: readonly PulledTensor[]): { pulled: number; tensors: number } {
    const { update, part, pull } = this.#pulling(id, caller);
    const { rank } = part.service;
    recordPulls(part.service, pull, sources, tensors);
    part.byPlan = undefined;
    if (rank.backend === 'cuda') this.#copyEarly(update, part, sources, tensors);
    return { pulled: pull.tensors.size, tensors: rank.tensors.length };
  }

  /** The part of a pull update `id` on the caller's connection that may take a pull now: neither committing nor failed. */
  #pulling(id: string, caller: Caller): { update: Update; part: Part; pull: Pull } {
    const { update, part } = this.#find(id, caller);
    if (!part.pull) {
      throw new ServeError('E_BAD_REQUEST', `the update of model "${update.name}" was begun without source "pull": its writer writes the staging segments it was handed; begin_update with source "pull" to pull`, { model: update.name });
    }
    if (part.digests || part.committing) {
      throw new ServeError('E_BAD_REQUEST', `rank ${part.service.rank.globalRank}'s part of the update of model "${update.name}" is committing or committed; pull before commit_update`, { model: update.name });
    }
    if (part.pullFailed) throw this.#pullEnded(update, part);
    return { update, part, pull: part.pull };
  }

  /**
   * pull_by_plan: records the tensors of the plan `find` gives for the part's rank (pullPlanDesk.ts
   * find: the caller's own, of this layout) as pull_tensors records its own, and runs the plan's
   * copies off the reply. Resolves as pull does.
   */
  pullByPlan(id: string, caller: Caller, find: (service: RankService) => PullPlan): { pulled: number; tensors: number } {
    const { update, part, pull } = this.#pulling(id, caller);
    const { rank } = part.service;
    // A plan is of a cuda rank (open_pull_plan refuses others), and find refuses one of another model or GPU.
    const plan = find(part.service);
    const pulled = pull.tensors;
    for (const name of plan.tensors.keys()) {
      if (pulled.has(name)) throw new ServeError('E_BAD_REQUEST', `pull_by_plan names tensor "${name}", pulled already in this update; pull each tensor once`, { model: update.name, tensor: name });
    }
    // The commit plans from the plan where it is the update's only pull.
    part.byPlan = pulled.size === 0 ? plan : undefined;
    for (const [name, at] of plan.tensors) pulled.set(name, at);
    const finals = (part.finals ??= part.service.rank.segments.map(() => -1));
    this.#queuePullWork(update, part, async (spent) => {
      const calling = performance.now();
      const result = await addon().cudaRunPullPlan(plan.native, finals, DIGEST_THREADS, part.prepared);
      this.#tallyPulled(part, spent, calling, finals, plan.digested, result);
    });
    return { pulled: pulled.size, tensors: rank.tensors.length };
  }

  /**
   * commit_update: seals this rank's copies (E_UPDATE_MAPPED while the writer still maps one
   * writable: unmap and commit again) and digests them; the last rank to commit publishes the
   * version and resolves once it serves. Earlier ranks resolve at once with the ranks still to commit.
   */
  async commit(id: string, caller: Caller): Promise<{ name: string; waiting: number[]; version?: number; fingerprint?: Fingerprint; service: RankService }> {
    const { update, part } = this.#find(id, caller);
    const { rank } = part.service;
    if (part.digests) {
      throw new ServeError('E_NO_UPDATE', `rank ${rank.globalRank}'s part of the update of model "${update.name}" is committed already; the version serves once ranks ${this.#waiting(update).join(', ')} commit`, { model: update.name });
    }
    if (part.committing) {
      throw new ServeError('E_BAD_REQUEST', `rank ${rank.globalRank}'s part of the update of model "${update.name}" is committing already; wait for its reply`, { model: update.name });
    }
    const began = performance.now();
    const rest: CommitRest = { waitPullsMs: 0, planMs: 0, queueMs: 0 };
    if (part.pull) {
      if (part.pull.tensors.size === 0) {
        throw new ServeError('E_BAD_REQUEST', `rank ${rank.globalRank}'s part of the pull update of model "${update.name}" pulls no tensor; name the writer's tensors with pull_tensors before commit_update`, { model: update.name });
      }
      // Set first, so no pull_tensors is taken while the early copies are waited for.
      const pulled = part.pulling ?? Promise.resolve();
      part.committing = pulled;
      await pulled;
      rest.waitPullsMs = performance.now() - began;
      if (update.ended) throw new ServeError('E_UPDATE_ABORTED', `the update of model "${update.name}" ended while rank ${rank.globalRank}'s pulls were copied (a connection of it closed); begin again`, { model: update.name });
      if (part.pullFailed) {
        part.committing = undefined;
        throw this.#pullEnded(update, part);
      }
      part.copied = part.byPlan ? [...part.byPlan.commit.copied] : pulledSegments(part.service, part.pull);
    }
    const planning = performance.now();
    // A tensor of a segment shared with the base is the base's bytes: its digest is the base's
    // (arenaDigests), so only the copied segments' tensors are read and digested, on either backend;
    // under a pull, only the pulled tensors (and any overlapping one): the rest was copied from the base.
    const rehash = part.byPlan ? part.byPlan.commit.rehash : part.pull ? rehashedUnderPull(part.service, part.pull) : undefined;
    // Under a pull, the tensors its early copies digested are not read again.
    const digests = rank.tensors.map((t, i) => ((rehash ? rehash[i] : part.copied[t.segment]) ? part.pullDigests?.get(i) : rank.arenaDigests?.[i]));
    // A loop, not a flatMap: an array per tensor was ~4 ms of a commit at 50,439 tensors (issue 31).
    const todo: Array<{ i: number; range: { file: number; start: number; end: number } }> = [];
    for (const [i, t] of rank.tensors.entries()) if (digests[i] === undefined) todo.push({ i, range: { file: t.segment, start: t.offset, end: t.offset + t.bytes } });
    const ranges = packTensorRanges(todo.map((x) => x.range));
    let reading: Promise<{ read: string[]; hashedOn: 'gpu' | 'cpu'; timings?: CommitTimings }>;
    if (rank.backend === 'cuda') {
      reading = this.#commitCuda(update, part, ranges, rest, planning);
    } else {
      // Sealing a segment walks its pages for pins (about 11 ms per GB, on the commit's path), so the
      // segments are sealed at once, on the addon's threads; the ones sealed stay sealed for the
      // next try, and the first refused in segment order is the commit's error.
      const seal = async () => {
        const sealing = [...part.fds.entries()].filter(([segment]) => part.copied[segment]).map(([segment, fd]) => addon().sealWritten(fd, segment, 'commit_update'));
        const refused = (await Promise.allSettled(sealing)).find((r) => r.status === 'rejected');
        if (refused) throw refused.reason;
      };
      reading = seal()
        .then(() => (todo.length > 0 ? addon().digestFiles(part.fds.map(procPath), ranges, DIGEST_THREADS) : []))
        .then((read) => ({ read, hashedOn: 'cpu' as const }));
    }
    part.committing = reading.catch(() => {});
    // A failed commit may be asked again (its reading settled: nothing of it runs on).
    const { read, hashedOn, timings } = await reading.catch((err: unknown) => {
      part.committing = undefined;
      throw err;
    });
    todo.forEach((x, n) => (digests[x.i] = read[n]));
    const split = timings && { ...timings, ...rest, ...(part.pullTimings ? { pullTimings: part.pullTimings } : {}) };
    const atPull = part.pullDigests?.size ?? 0;
    part.service.log.info(
      {
        model: update.name, globalRank: rank.globalRank, tensors: digests.length, read: todo.length + atPull,
        // Where this version's digests were hashed: by the pulls, the commit, or both (the commit's word when neither hashed).
        hashedOn: todo.length === 0 && atPull === 0 ? hashedOn : part.pullHashedOnCpu || (todo.length > 0 && hashedOn === 'cpu') ? 'cpu' : 'gpu',
        ...(part.pull ? { pulled: part.pull.tensors.size, digestedAtPull: atPull } : {}), ...(split ? { timings: split } : {}),
      },
      `update sealed: ${todo.length + atPull} of ${digests.length} tensors digested` + (atPull ? ` (${atPull} as they were pulled)` : '') + ", the others' digests the base's (their segments are shared with it)",
    );
    if (update.ended) throw new ServeError('E_UPDATE_ABORTED', `the update of model "${update.name}" ended while rank ${rank.globalRank} was digested (a connection of it closed); begin again`, { model: update.name });
    part.digests = digests as string[];
    const waiting = this.#waiting(update);
    if (waiting.length > 0) return { name: update.name, waiting, service: part.service };
    return { ...(await this.#publish(update, began)), name: update.name, waiting, service: part.service };
  }

  /** A connection ended: an update it began and that is not committed everywhere ends, leaving nothing. */
  connectionClosed(connectionId: number): void {
    for (const update of [...this.#updates.values()]) {
      if (!update.publishing && [...update.parts.values()].some((p) => p.connectionId === connectionId)) this.#end(update, 'a connection of it ended before every rank committed');
    }
  }

  async #publish(update: Update, began: number): Promise<{ version: number; fingerprint: Fingerprint }> {
    update.publishing = true;
    const publishing = performance.now();
    const parts = [...update.parts.values()].sort((a, b) => a.service.rank.globalRank - b.service.rank.globalRank);
    const baseFields = Object.fromEntries(Object.entries(parts[0]!.service.rank.fingerprintFields).filter(([k]) => k !== 'tpRank'));
    const fingerprint = writtenVersionFingerprint(baseFields, parts.map((p) => p.digests!));
    let outcome = 'its publish failed';
    try {
      const differ = replicaMismatches(parts.map((p) => ({ globalRank: p.service.rank.globalRank, tp: p.service.rank.tpSize, tensors: p.service.rank.tensors, digests: p.digests! })));
      if (differ.length > 0) {
        const named = differ.slice(0, 3).map((d) => `${d.name} (${d.piece === 'whole' ? 'replicated' : `KV ${d.piece}`}) on ranks ${d.ranks[0]} and ${d.ranks[1]}`);
        throw new ServeError(
          'E_UPDATE_REPLICAS',
          `the update of model "${update.name}" holds different bytes on ranks that must hold the same: ${named.join(', ')}${differ.length > 3 ? ` and ${differ.length - 3} more` : ''}; ` +
            'an engine would run a different copy of one weight on each rank. Nothing of it is kept: write each replicated piece alike on every rank (write_version cuts them from one tensor), then begin again',
          { model: update.name, tensors: differ.map((d) => ({ name: d.name, ranks: d.ranks })) },
        );
      }
      const ranks = parts.map((p) => ({
        globalRank: p.service.rank.globalRank,
        localRank: p.service.rank.localRank,
        segmentPaths: p.fds.map(procPath),
        // cuda: a shared segment is the base's memory, which no descriptor's inode names.
        ...(p.service.rank.backend === 'cuda' ? { segmentFds: [...p.fds], segmentMemory: p.service.rank.segments.map((s, i) => (p.copied[i] ? null : (s.memory ?? null))) } : {}),
        digests: p.digests!,
        shared: p.copied.flatMap((copied, i) => (copied ? [] : [i])),
      }));
      const { version } = await this.publisher!({ name: update.name, baseVersion: update.baseVersion, fingerprint, ranks, ...(update.currentAtBegin === undefined ? {} : { currentAtBegin: update.currentAtBegin }) });
      const now = performance.now();
      // publishMs: the version's manifest, fingerprint, model actor and ranks' adoption until it
      // serves; commitMs: this last rank's commit from its request to here (the reply follows).
      parts[0]!.service.log.info(
        { model: update.name, version, fingerprint: fingerprint.fingerprint, publishMs: now - publishing, commitMs: now - began },
        'update committed: the new version serves',
      );
      outcome = 'published';
      return { version, fingerprint };
    } catch (err) {
      outcome = `its publish failed (${errorCode(err) ?? 'error'})`;
      throw err;
    } finally {
      // The version's ranks hold descriptors of their own now (or it failed): these copies go.
      this.#end(update, outcome);
    }
  }

  /**
   * cuda: the staging allocations are copied into final ones, which replace them in the part (the
   * daemon's handle of staging goes now; a writer's mapping may keep its pages, never served).
   */
  async #commitCuda(
    update: Update,
    part: Part,
    ranges: Parameters<typeof commitCudaPart>[3],
    rest: CommitRest,
    planning: number,
  ): Promise<{ read: string[]; hashedOn: 'gpu' | 'cpu'; timings: CommitTimings }> {
    const pull = part.pull && { finals: part.finals ?? [], copies: part.byPlan ? [...part.byPlan.commit.gaps] : commitGaps(part.service, part.pull, part.copied), prepared: part.prepared };
    const calling = performance.now();
    rest.planMs = calling - planning;
    if (pull && pull.copies.length === 0 && ranges.length === 0 && part.copied.every((c, i) => !c || (pull.finals[i] ?? -1) >= 0)) return this.#commitAsPulled(update, part);
    const { fds, digests, hashedOn, timings } = await commitCudaPart(part.service, part.fds, part.copied, ranges, DIGEST_THREADS, pull);
    rest.queueMs = Math.max(0, performance.now() - calling - timings.nativeMs);
    if (update.ended) {
      this.#closeAway(part, fds.filter((fd) => fd >= 0));
      return { read: digests, hashedOn, timings };
    }
    // The staging allocations these finals replace (the writer's mapping may keep their pages).
    const replaced: number[] = [];
    fds.forEach((fd, i) => {
      if (fd < 0) return;
      replaced.push(part.fds[i]!);
      part.fds[i] = fd;
    });
    this.#closeAway(part, replaced);
    // The finals' descriptors made at pull time: the part holds duplicates of them now; the
    // prepared mappings go off the reply's path.
    this.#closeFinals(part);
    dropPrepared(part);
    return { read: digests, hashedOn, timings };
  }

  /**
   * A cuda pull whose copies wrote every segment it changes whole and digested every tensor the
   * commit would (a full pull, or one of whole segments, of tensors sharing no byte): nothing is
   * left to copy, map or hash, so the finals the pulls made are the version's segments as they are,
   * with no native call (its thread pool's queue, the context and an empty stream cost 0.5-1.2 ms
   * of an H100 commit, bench/RESULTS.md 2026-12-07).
   */
  #commitAsPulled(update: Update, part: Part): { read: string[]; hashedOn: 'gpu'; timings: CommitTimings } {
    const done = { read: [], hashedOn: 'gpu' as const, timings: { allocateMs: 0, openMs: 0, mapMs: 0, copyMs: 0, digestMs: 0, nativeMs: 0, mapped: 0 } };
    // An update that ended closes its finals with the rest of it (#end).
    if (update.ended) return done;
    const finals = part.finals!;
    const replaced: number[] = [];
    part.copied.forEach((copied, i) => {
      if (!copied) return;
      replaced.push(part.fds[i]!);
      part.fds[i] = finals[i]!;
      finals[i] = -1;
    });
    // The base's segments these finals replace (the part's own references), the finals no pull
    // wrote (prepared for segments it left as they were), and the prepared mappings.
    this.#closeAway(part, replaced);
    this.#closeFinals(part);
    dropPrepared(part);
    return done;
  }

  /**
   * A pull's copy failed: the update ends (its finals hold some of the pulls and not others, and a
   * tensor pulled again would be refused as pulled already), and the failure, saying so, answers
   * this request; the writer begins again.
   */
  #pullEnded(update: Update, part: Part): ServeError {
    const failed = part.pullFailed as { code?: unknown; message?: unknown };
    this.#end(update, `rank ${part.service.rank.globalRank}'s copy of pulled tensors failed`);
    return new ServeError(
      receivedCode(typeof failed.code === 'string' ? failed.code : 'E_CUDA'),
      `${String(failed.message ?? failed)}; the pull update of model "${update.name}" ended with it: begin_update again`,
      { model: update.name },
    );
  }

  /**
   * A cuda pull_tensors request just recorded: makes the finals of the segments it writes (those
   * not made yet) and copies its tensors into them, after the requests before it (each opens its
   * own sources), off the request's reply. Nothing of it is visible until the commit serves it.
   */
  #copyEarly(update: Update, part: Part, sources: readonly string[], tensors: readonly PulledTensor[]): void {
    const { service } = part;
    const plan = batchPlan(service, sources, tensors);
    const finals = (part.finals ??= service.rank.segments.map(() => -1));
    this.#queuePullWork(update, part, async (spent) => {
      const calling = performance.now();
      const result = await copyPulled(service, finals, plan, DIGEST_THREADS, part.prepared);
      this.#tallyPulled(part, spent, calling, finals, plan.digested.map((d) => d.index), result);
    });
  }

  /**
   * What one pull's native call (begun at `calling`) made: the finals it made (kept even when the
   * update ended meanwhile: #end closes them once the pull settled), the digests of the tensors it
   * digested (`digested`, by the rank's tensor index), and its time, added to `spent`.
   */
  #tallyPulled(part: Part, spent: NonNullable<Part['pullTimings']>, calling: number, finals: number[], digested: readonly number[], result: { fds: number[]; timings: PullCopyTimings } & CudaDigested): void {
    const { fds, timings, digests, hashedOn } = result;
    spent.queueMs += Math.max(0, performance.now() - calling - timings.nativeMs);
    fds.forEach((fd, i) => fd >= 0 && (finals[i] = fd));
    const pullDigests = (part.pullDigests ??= new Map());
    digested.forEach((index, n) => pullDigests.set(index, digests[n]!));
    if (digested.length > 0 && hashedOn === 'cpu') part.pullHashedOnCpu = true;
    spent.allocateMs += timings.allocateMs;
    spent.openMs += timings.openMs;
    spent.mapMs += timings.mapMs;
    spent.copyMs += timings.copyMs;
    spent.digestMs += timings.digestMs;
    spent.releaseMs += timings.releaseMs;
    spent.nativeMs += timings.nativeMs;
    spent.setupMs += timings.setupMs;
    spent.moduleMs += timings.moduleMs;
    spent.copiedByKernelBytes += timings.copiedByKernelBytes;
  }

  /**
   * A pull begun with `prepare`: makes the finals of the segments `which` marks and keeps them
   * mapped (cudaUpdateSegments.ts prepareFinals), first in the part's chain of pull work, so the
   * copies of every pull_tensors request go straight into them. A failure is the first pull's or
   * the commit's answer, as a pull's own.
   */
  #prepareEarly(update: Update, part: Part, which: boolean[]): void {
    this.#queuePullWork(update, part, async (spent) => {
      const made = await prepareFinals(part.service, which);
      // Kept even when the update ended meanwhile: #end closes and drops them once this settled.
      const finals = (part.finals ??= part.service.rank.segments.map(() => -1));
      made.fds.forEach((fd, i) => fd >= 0 && (finals[i] = fd));
      part.prepared = made.id;
      spent.prepareMs = made.timings.nativeMs;
    });
  }

  /**
   * Queues `work` on the part's chain of pull work (`pulling`: one native call at a time, in the
   * order asked), skipped once the update ended or an earlier piece failed; the first failure is
   * kept (`pullFailed`) for the next pull_tensors or the commit to answer with.
   */
  #queuePullWork(update: Update, part: Part, work: (spent: NonNullable<Part['pullTimings']>) => Promise<void>): void {
    const spent = (part.pullTimings ??= { allocateMs: 0, openMs: 0, mapMs: 0, copyMs: 0, digestMs: 0, releaseMs: 0, nativeMs: 0, queueMs: 0, setupMs: 0, moduleMs: 0, copiedByKernelBytes: 0 });
    part.pulling = (part.pulling ?? Promise.resolve())
      .then(async () => {
        if (!update.ended && !part.pullFailed) await work(spent);
      })
      .catch((err: unknown) => {
        part.pullFailed ??= err;
      });
  }

  #find(id: string, caller: Caller): { update: Update; part: Part } {
    const found = this.#parts().find(({ part }) => part.id === id && part.connectionId === caller.connectionId);
    if (!found) {
      throw new ServeError('E_NO_UPDATE', `update ${id.slice(0, 8)}… is not in progress on this connection: it was committed, ended with a connection of it, or begun on another connection; begin_update again`);
    }
    return found;
  }

  #waiting(update: Update): number[] {
    return update.ranks.filter((g) => !update.parts.get(g)?.digests);
  }

  #end(update: Update, why: string): void {
    if (update.ended) return;
    update.ended = true;
    if (this.#updates.get(update.name) === update) this.#updates.delete(update.name);
    // A descriptor on its way to the writer is closed once the send settled, and one a commit reads
    // once the commit settled: never under either.
    for (const part of update.parts.values()) {
      void Promise.all([part.sent, part.committing, part.pulling]).then(() => {
        this.#closeAway(part, part.fds.splice(0));
        this.#closeFinals(part);
        dropPrepared(part);
      });
    }
    const log = update.parts.values().next().value?.service.log;
    if (why !== 'published') log?.info({ model: update.name }, `update ended, nothing of it kept: ${why}`);
  }

  /** Closes `fds` (the part's, forgotten by it) on the addon's threads; see closed(). */
  #closeAway(part: Part, fds: number[]): void {
    if (fds.length === 0) return;
    const closing: Promise<void> = addon()
      .closeFdsAsync(fds)
      .catch((err: unknown) => part.service.log.warn({ model: part.service.rank.name, err }, "an update's descriptors could not all be closed"))
      .finally(() => this.#closing.delete(closing));
    this.#closing.add(closing);
  }

  /** Closes and forgets the finals a pull made early (the part's own descriptors; -1 where none was made). */
  #closeFinals(part: Part): void {
    this.#closeAway(part, (part.finals?.splice(0) ?? []).filter((fd) => fd >= 0));
  }

  #parts(): { update: Update; part: Part }[] {
    return [...this.#updates.values()].flatMap((update) => [...update.parts.values()].map((part) => ({ update, part })));
  }
}

/**
 * Which of the rank's segments (by position) the update copies: those holding a tensor of
 * `tensors`, every one when absent. A name the rank does not hold is refused, naming it.
 */
function segmentsToCopy(service: RankService, tensors: readonly string[] | undefined): boolean[] {
  const { rank } = service;
  if (!tensors) return rank.segments.map(() => true);
  const byName = tensorsByName(rank.tensors);
  const copied = rank.segments.map(() => false);
  for (const name of tensors) {
    const segment = byName.get(name)?.segment;
    if (segment === undefined) {
      throw new ServeError(
        'E_UNKNOWN_TENSOR',
        `begin_update names tensor "${name}", which rank ${rank.globalRank} of model "${rank.name}" does not hold; name tensors of the base's manifest (get_state lists them), or none to write any`,
        { model: rank.name, tensor: name },
      );
    }
    copied[rank.segments.findIndex((s) => s.segment === segment)] = true;
  }
  return copied;
}

/** Unmaps a pull's prepared finals from the daemon, on the addon's threads (their memory stays with the descriptors while any holds it). */
function dropPrepared(part: Part): void {
  const id = part.prepared;
  if (id === undefined) return;
  part.prepared = undefined;
  addon()
    .cudaDropPrepared(id)
    .catch((err: unknown) => part.service.log.warn({ model: part.service.rank.name, err }, "a pull's prepared finals could not be unmapped"));
}

/** Closes and forgets every descriptor in `fds`. */
function closeAll(fds: number[]): void {
  for (const fd of fds.splice(0)) addon().closeFd(fd);
}

/** A path that opens this process's descriptor `fd` anew (its own open file, read-only when opened so). */
const procPath = (fd: number) => `/proc/self/fd/${fd}`;
