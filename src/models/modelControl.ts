// node.load and node.unload (what the control socket calls too): checks a request against what
// the node serves, plans a model to load, hands it to the supervisor and follows its model actor
// until it serves or fails. The machines decide the lifecycle; this only asks and reports.
import type { ActorRefFrom, SnapshotFrom } from 'xstate';
import { planModel, spansGroup, type ModelNode, type PlannedModel } from './planModel.js';
import { alreadyLoadedError } from './alreadyLoadedError.js';
import { tellGroupStale } from './groupReload.js';
import { WeightdError, errorCode, receivedCode, RankFailedError, serializeError } from '../errors.js';
import { evictForLoad, type EvictForLoadInput } from './evictForLoad.js';
import { checkEvictionPolicy, type EvictionPolicy } from './evictionPolicy.js';
import type { Logger } from '../log.js';
import { LOAD_RUNNING, modelMachine } from './modelMachine.js';
import { modelActor, modelEntries, modelFailureMessage, modelLoadId, modelRegistry, type ModelHost } from './modelHost.js';
import { resolveModelSpec, type ModelRequest, type ModelSpec } from './modelSpecs.js';
import type { LoadResult, ModelStatus, NodeStatus, RollbackResult, UnloadResult } from '../nodeStatus.js';
import { rankFingerprint } from '../checkpoint/fingerprint.js';
import type { WrittenVersion } from '../serve/updateDesk.js';
import type { RestoredVersions } from './planModel.js';
import { dropSuperseded } from './dropSuperseded.js';
import { writtenDirectory } from '../keeper/writtenDirectory.js';

/** States in which a model holds memory it is still filling, as the model machine tags them: one such load at a time. */
const LOADING_STATES = new Set<string>(Object.values(modelMachine.states).filter((s) => s.tags.includes(LOAD_RUNNING)).map((s) => s.key));
/** A stale model's reload, refused because its files were still being written, is tried again after 1 s, 2 s, 4 s... up to 30 s. */
const RELOAD_RETRY_FIRST_MS = 1000;
const RELOAD_RETRY_MAX_MS = 30_000;

type ModelSnapshot = SnapshotFrom<typeof modelMachine>;

export class ModelControl {
  readonly #actor: ModelHost;
  readonly #config: ModelNode & { evict: EvictionPolicy; keepVersions: number };
  /** Drops a processed layout to make room (ServerRegistry.dropProcessed); without device servers there is none. */
  readonly #dropProcessed: EvictForLoadInput['dropProcessed'];
  readonly #log: Logger;
  readonly #status: () => NodeStatus;
  /** The status of each version of a name (the node's whole status is built for none of the others). */
  readonly #versionsOf: (name: string) => ModelStatus[];
  /** Loads handed to the supervisor, which name their model actors (modelLoadId). */
  #loads = 0;
  /** The model being planned or loaded now, if any. */
  #loading: string | undefined;
  /** Called when a load ends, and on close: a reload waiting for its turn looks again. */
  readonly #wakers = new Set<() => void>();
  /** Operator unloads per model name: a reload retried after one of its name gives up. */
  readonly #unloads = new Map<string, number>();
  #closed = false;
  /** Vouches sent (#vouch), which name them. */
  #vouches = 0;
  /** The highest version number given to each name (PlannedModel.version). */
  readonly #versions = new Map<string, number>();
  /** Per name, the end of its commits and rollbacks in flight (#serially). */
  readonly #changing = new Map<string, Promise<unknown>>();

  constructor(options: {
    actor: ModelHost;
    config: ModelNode & { evict: EvictionPolicy; keepVersions: number };
    log: Logger;
    status: () => NodeStatus;
    versions: (name: string) => ModelStatus[];
    dropProcessed?: EvictForLoadInput['dropProcessed'];
  }) {
    this.#dropProcessed = options.dropProcessed ?? (async () => false);
    this.#actor = options.actor;
    this.#config = options.config;
    this.#log = options.log;
    this.#status = options.status;
    this.#versionsOf = options.versions;
  }

  /** `evict`: this load's eviction policy instead of the node's (--evict). */
  async load(request: ModelRequest, { evict }: { evict?: EvictionPolicy } = {}): Promise<LoadResult> {
    this.#refuseUnlessReady('load');
    const policy = evict === undefined ? this.#config.evict : checkEvictionPolicy('--evict', evict);
    const spec = resolveModelSpec(request);
    const busy = this.#loading ?? this.#status().models.find((m) => LOADING_STATES.has(m.state))?.name;
    if (busy !== undefined) {
      throw new WeightdError('E_LOAD_BUSY', `model "${busy}" is loading; load "${spec.name}" once it serves or fails (weightd ctl list shows it): one load at a time, so that each is judged against what is resident`, { loading: busy });
    }
    this.#loading = spec.name;
    try {
      const planned = await this.#plan(spec);
      this.#refuseUnlessReady('load');
      const same = this.#status().models.find((m) => m.fingerprint === planned.plan.fingerprint && m.state !== 'draining' && m.state !== 'released');
      if (same) {
        if (same.name !== spec.name) {
          throw alreadyLoadedError(spec, planned.plan.fingerprint, { name: same.name, modelDir: same.model }, 'unload that one first, or load another checkpoint');
        }
        // Across the group, the other nodes' loads of it gather as one swap: this node joins it with
        // the version it serves, rather than leave them to wait for it (docs/multi-node.md).
        if (planned.placement.nnodes > 1) await this.#vouch(planned);
        this.#log.info({ name: spec.name, fingerprint: planned.plan.fingerprint }, 'load: already loaded, nothing to do');
        return { name: spec.name, fingerprint: planned.plan.fingerprint, alreadyLoaded: true, model: same, evicted: [] };
      }
      let evicted: LoadResult['evicted'] = [];
      const model = await this.#serve(planned, spec.name).catch(async (err: unknown) => {
        // The eviction hook: room is made once, then the load is tried once more. Not for a model
        // that spans the group: its refusal here has already aborted it on every node.
        if (policy === 'off' || errorCode(err) !== 'E_DOES_NOT_FIT' || planned.placement.nnodes > 1) throw err;
        evicted = await this.#evict(policy, err as WeightdError, spec.name);
        return this.#serve(planned, spec.name).catch((again: unknown) => {
          throw evictedFirst(again, evicted);
        });
      });
      return { name: spec.name, fingerprint: planned.plan.fingerprint, alreadyLoaded: false, model, evicted };
    } finally {
      this.#loading = undefined;
      for (const wake of [...this.#wakers]) wake();
    }
  }

  /**
   * Serves a version a writer committed (src/serve/updateDesk.ts) as the newest of its name: a
   * model actor like a load's, planned as its base with the written content's fingerprint, whose
   * ranks adopt the sealed segments. Older versions drain as in a hot swap. Resolves with its
   * number once it serves.
   */
  publishUpdate(written: WrittenVersion): Promise<{ version: number }> {
    return this.#serially(written.name, () => this.#publishUpdate(written));
  }

  /** The fingerprint of the version of `name` clients are pointed to now (an update's begin notes it: UpdateDesk.currentOf). */
  currentOf(name: string): string | undefined {
    return this.#versionsOf(name).find((m) => m.current)?.fingerprint;
  }

  async #publishUpdate(written: WrittenVersion): Promise<{ version: number }> {
    this.#refuseUnlessReady('serve an update of');
    const base = modelActor(this.#actor.getSnapshot(), written.baseVersion)?.getSnapshot().context.planned;
    if (!base) {
      throw new WeightdError('E_UPDATE_BASE', `the version of model "${written.name}" the update was written over is no longer loaded; begin the update again from the version that serves now`, { model: written.name });
    }
    // A hot swap or a rollback while the update was written chose another version on purpose:
    // the update, written over what was current before, would undo that choice by becoming current.
    const current = this.currentOf(written.name);
    if (written.currentAtBegin !== undefined && current !== written.currentAtBegin) {
      throw new WeightdError(
        'E_UPDATE_BASE',
        `the version of model "${written.name}" that was current when the update began is no longer current (a hot swap or a rollback chose ${current ? `fingerprint ${current.slice(0, 12)}` : 'another'} meanwhile), so the update, written over it, is not served; begin it again from the version that serves now`,
        { model: written.name },
      );
    }
    const fingerprint = written.fingerprint.fingerprint;
    // Content that a resident written version of the name holds already (its bytes written
    // again): that version becomes current, with no second copy. A checkpoint version's
    // fingerprint follows other rules (spec §4), and a draining version takes no new lease: for
    // those the commit serves a copy (docs/weight-updates.md).
    const snap = this.#actor.getSnapshot();
    const same = modelEntries(snap).find((e) => e.name === written.name && !e.unloaded && e.fingerprint === fingerprint);
    const sameVersion = same && versionOf(modelActor(snap, same.id)?.getSnapshot().context.planned);
    if (sameVersion !== undefined) return { version: (await this.#rollback(written.name, sameVersion)).version };
    const version = Math.max(this.#versions.get(written.name) ?? 0, versionOf(base)!) + 1;
    const planned: PlannedModel = {
      ...base,
      // A commit retains the versions before it (--keep-versions) and is kept before it serves
      // (keptBeforeServing): it drops none of them, whatever its base's load did.
      dropsOlderFirst: false,
      // No files: its content was written, not read, so no change to the checkpoint makes it stale.
      plan: { ...base.plan, fingerprint, fingerprintFields: written.fingerprint.fields, files: [], ranks: base.plan.ranks.map((r, g) => r && { ...r, fingerprint: rankFingerprint(fingerprint, g) }) },
      origin: 'update',
      version,
      base: base.plan.fingerprint,
      // A written base's directory is the one it was itself written over; a checkpoint's, as it resolves now.
      writtenOver: base.writtenOver ?? writtenDirectory(base.spec.modelDir),
      currentSince: Date.now(),
      written: [...written.ranks]
        .sort((a, b) => a.localRank - b.localRank)
        .map((r) => ({ segmentPaths: r.segmentPaths, ...(r.segmentFds ? { segmentFds: r.segmentFds, segmentMemory: r.segmentMemory } : {}), digests: r.digests, shared: r.shared })),
    };
    await this.#serve(planned, written.name);
    this.#versions.set(written.name, version);
    // The versions beyond --keep-versions drain after the commit's reply, not before it (their
    // unload's transitions and the node manifest written again took a third of a commit's
    // publication), and before any request that follows it: setImmediate runs ahead of the next
    // poll for I/O, where such a request is read.
    setImmediate(() => {
      try {
        this.#retain(written.name);
      } catch (err) {
        this.#log.error({ err, name: written.name }, 'the versions beyond --keep-versions could not be drained');
      }
    });
    return { version };
  }

  /**
   * Serves the written versions an earlier daemon kept (src/actors/restoreWritten.ts), once the
   * node is ready: each name's in order of number, then the version that was current is made
   * current again and kept anew (so its record is the newest: the next start finds it so), and
   * --keep-versions drains the excess. Never rejects: a version that fails is logged, the others serve.
   */
  async restoreWritten({ models, current }: RestoredVersions): Promise<void> {
    for (const planned of models) {
      const { name } = planned.spec;
      try {
        await this.#serve(this.#namingShared(planned), name);
        this.#versions.set(name, Math.max(this.#versions.get(name) ?? 0, planned.version!));
        this.#log.info({ name, version: planned.version, fingerprint: planned.plan.fingerprint }, `written version ${planned.version} of model "${name}" restored from the keeper`);
      } catch (err) {
        this.#log.error({ name, version: planned.version, code: errorCode(err) }, `written version ${planned.version} of model "${name}" was not restored: ${(err as Error).message}`);
      }
    }
    for (const { name, version } of current) {
      try {
        // A rollback keeps the version anew; one current already is kept anew here.
        await this.#serially(name, async () => {
          if ((await this.#rollback(name, version)).alreadyCurrent) await this.#keepAgain(name, this.#retained(name, version).child, Date.now());
        });
      } catch (err) {
        this.#log.warn({ name, version }, `model "${name}" was at version ${version} when the last daemon ended, which is not restored (${(err as Error).message}); its newest restored version is current`);
      }
    }
    for (const name of new Set(models.map((m) => m.spec.name))) this.#retain(name);
  }

  /**
   * A restored written version whose base serves again: its segments shared with the base are the
   * base's memory (on cuda the keeper's descriptors name no identity), so they take the names the
   * base's ranks gave them (SegmentExport.memory) and eviction counts them once.
   */
  #namingShared(planned: PlannedModel): PlannedModel {
    const base = this.#status().models.find((m) => m.name === planned.spec.name && m.fingerprint === planned.base && m.state === 'serving');
    if (!base || !planned.written) return planned;
    const written = planned.written.map((w, localRank) => {
      const segments = base.ranks.find((r) => r.localRank === localRank)?.segments;
      return segments ? { ...w, segmentMemory: segments.map((s, i) => (w.shared.includes(i) ? (s.memory ?? null) : null)) } : w;
    });
    return { ...planned, written };
  }

  /**
   * Makes a retained version of `name` (one a writer's commit left resident, --keep-versions)
   * current again, with no copy: its ranks become the newest of the name on their sockets and
   * watchers hear model_ready, as for a new version; the version it replaces is retained in turn.
   * With a keeper it resolves only once the keeper's records say so (a restart then makes it
   * current again), and fails with E_VERSION_NOT_KEPT, changing nothing, when they cannot.
   */
  rollback(name: string, version: number): Promise<RollbackResult> {
    return this.#serially(name, () => this.#rollback(name, version));
  }

  async #rollback(name: string, version: number): Promise<RollbackResult> {
    this.#refuseUnlessReady('roll back');
    const { child, fingerprint, current } = this.#retained(name, version);
    if (current) return { name, version, fingerprint, alreadyCurrent: true };
    // Kept first, so the reply never says more than a restart would find: a crash after the keep
    // and before the promotion restarts on this version, as the caller asked.
    const at = Date.now();
    try {
      await this.#keepAgain(name, child, at);
    } catch (err) {
      // A rank that did keep it says it is current since `at`: the version that stays current is
      // kept anew after it, so that a restart agrees with this refusal.
      const stays = this.#versionsOf(name).find((m) => m.current);
      if (stays) {
        await Promise.resolve()
          .then(() => this.#keepAgain(name, this.#retained(name, stays.version).child, Math.max(Date.now(), at + 1)))
          .catch(() => {});
      }
      const why = (err as Error).message;
      throw new WeightdError(
        'E_VERSION_NOT_KEPT',
        `model "${name}" was not rolled back to version ${version}: ${why}, and a daemon restart would not have found it current; ` +
          `${stays ? `version ${stays.version}` : 'the version that served'} stays current. Roll back again once the keeper answers (weightd keeper status)`,
        { model: name, version, ...(stays ? { current: stays.version } : {}) },
      );
    }
    child.send({ type: 'MODEL_PROMOTE' });
    this.#log.info({ name, version, fingerprint }, `model "${name}" rolled back to version ${version}`);
    return { name, version, fingerprint, alreadyCurrent: false };
  }

  /** A resident version of `name` that serves (E_UNKNOWN_VERSION naming those that do otherwise), and whether it is current. */
  #retained(name: string, version: number): { child: ActorRefFrom<typeof modelMachine>; fingerprint: string; current: boolean } {
    const snap = this.#actor.getSnapshot();
    const live = modelEntries(snap).filter((e) => e.name === name && !e.unloaded);
    const found = live.find((e) => versionOf(modelActor(snap, e.id)?.getSnapshot().context.planned) === version);
    const child = found && modelActor(snap, found.id);
    if (!found || !child || child.getSnapshot().value !== 'serving') {
      const held = this.#versionsOf(name).filter((m) => m.state === 'serving').map((m) => m.version);
      throw new WeightdError(
        'E_UNKNOWN_VERSION',
        `model "${name}" has no version ${version} resident to roll back to; ` +
          (held.length > 0 ? `it holds versions ${held.join(', ')} (weightd ctl list): roll back to one of those, or load the checkpoint again` : `no version of "${name}" serves: load it (weightd ctl load)`),
        { model: name, version, versions: held },
      );
    }
    const fingerprint = found.fingerprint;
    const current = this.#versionsOf(name).find((m) => m.fingerprint === fingerprint && m.version === version)?.current === true;
    return { child, fingerprint, current };
  }

  /**
   * Has the ranks of a version of `name` keep their segments again, with a record that says it is
   * current since `at` (kept records: src/actors/restoreWritten.ts makes the latest current at a
   * restart), or, `at` undefined, with the one their records carried. Resolves once the keeper
   * holds that record of every serving rank, at once without a keeper; rejects with the reason
   * when a rank's keep failed, or when the version stops serving first.
   */
  #keepAgain(name: string, child: ActorRefFrom<typeof modelMachine>, at: number | undefined): Promise<void> {
    const { context } = child.getSnapshot();
    if (context.keeper === undefined) return Promise.resolve();
    const waiting = new Set(context.ranks.filter((r) => r.state === 'serving').map((r) => r.localRank));
    return new Promise<void>((resolve, reject) => {
      const done = (err?: Error) => {
        kept.unsubscribe();
        states.unsubscribe();
        if (err) reject(err);
        else resolve();
      };
      const kept = child.on('RANK_KEPT', (e) => {
        if ((at !== undefined && e.currentSince !== at) || !waiting.has(e.localRank)) return;
        if (!e.kept) return done(new Error(`the keeper did not keep local rank ${e.localRank}'s shard (${e.reason ?? 'no reason given'})`));
        waiting.delete(e.localRank);
        if (waiting.size === 0) done();
      });
      const stopped = () => done(new Error(`its version stopped serving before the keeper held it`));
      const states = child.subscribe({ next: (snap) => snap.value !== 'serving' && stopped(), error: stopped, complete: stopped });
      if (waiting.size === 0) return done();
      this.#log.debug({ name, ranks: [...waiting], currentSince: at }, `model "${name}": keeping the version again`);
      child.send({ type: 'KEEPER_BACK', ...(at !== undefined ? { currentSince: at } : {}) });
    });
  }

  /** Runs `change` once the commits and rollbacks of `name` before it have settled: each keeps its version's records in the order it makes it current. */
  #serially<T>(name: string, change: () => Promise<T>): Promise<T> {
    const result = (this.#changing.get(name) ?? Promise.resolve()).then(change);
    const settled = result.then(() => {}, () => {});
    this.#changing.set(name, settled);
    void settled.then(() => this.#changing.get(name) === settled && this.#changing.delete(name));
    return result;
  }

  /** Unloads the versions of `name` beyond the current one and the --keep-versions before it (they drain, freed once unleased). */
  #retain(name: string): void {
    const versions = this.#versionsOf(name).filter((m) => m.state === 'serving' && !m.current);
    // Oldest first, by number: the most recent --keep-versions stay.
    const excess = versions.sort((a, b) => a.version - b.version).slice(0, Math.max(0, versions.length - this.#config.keepVersions));
    if (excess.length === 0) return;
    const entries = modelEntries(this.#actor.getSnapshot());
    const ids = entries.filter((e) => e.name === name && !e.unloaded && excess.some((m) => m.fingerprint === e.fingerprint)).map((e) => e.id);
    this.#log.info({ name, versions: excess.map((m) => m.version), keepVersions: this.#config.keepVersions }, 'versions beyond --keep-versions drain');
    this.#actor.send({ type: 'MODEL_UNLOAD', ids, force: false });
  }

  /** The node ends: reloads waiting to be retried give up. */
  close(): void {
    this.#closed = true;
    for (const wake of [...this.#wakers]) wake();
  }

  /**
   * Loads a model again once its checkpoint files changed (the supervisor drained the stale
   * version and emitted MODEL_STALE): node.load's path, so the new version is planned from the
   * files as they are now. Never rejects: the outcome is logged.
   *
   * Retried until it serves, while another load runs (E_LOAD_BUSY: once that load ends) or the
   * files are still being written (E_FILE_CHANGED: after a backoff); not once an operator unloaded
   * or loaded that name, nor once the node stops.
   *
   * A model that spans the group is not loaded again by this node alone: node 0 hears of it, and
   * has every node reload it with `group` (src/models/groupReload.ts). Resolves with the load's
   * result once it serves (alreadyLoaded: this node's files hold the version it serves), else undefined.
   */
  async reload(spec: ModelSpec, { group = false }: { group?: boolean } = {}): Promise<LoadResult | undefined> {
    if (!group && spansGroup(spec.tpSize, this.#config)) {
      tellGroupStale(this.#actor, this.#status(), spec, this.#log);
      return undefined;
    }
    const unloads = this.#unloads.get(spec.name) ?? 0;
    for (let backoffMs = RELOAD_RETRY_FIRST_MS; ; ) {
      try {
        const result = await this.load({ model: spec.modelDir, name: spec.name, tensorParallelSize: spec.tpSize, planFile: spec.planFile, layouts: spec.layouts });
        const done = result.alreadyLoaded ? ': its checkpoint files still hold the version that serves' : ' was loaded again from its changed checkpoint files, and serves';
        this.#log.info({ name: spec.name, fingerprint: result.fingerprint }, `model "${spec.name}"${done}`);
        return result;
      } catch (err) {
        const code = errorCode(err);
        const fields = { name: spec.name, model: spec.modelDir, code };
        if (this.#closed || (code !== 'E_LOAD_BUSY' && code !== 'E_FILE_CHANGED')) {
          this.#log.error(fields, `model "${spec.name}" was not loaded again after its checkpoint files changed (${(err as Error).message}); clients load it from disk until weightd ctl load loads it`);
          return undefined;
        }
        const busy = code === 'E_LOAD_BUSY';
        this.#log.warn(
          { ...fields, retryMs: busy ? undefined : backoffMs },
          `model "${spec.name}" is not loaded again yet (${(err as Error).message}); trying again ${busy ? 'once the running load ends' : `in ${backoffMs} ms`}`,
        );
        const go = busy ? await this.#untilIdle() : await this.#after(backoffMs);
        if (!busy) backoffMs = Math.min(backoffMs * 2, RELOAD_RETRY_MAX_MS);
        // In a reload across the group, the version that serves on may be this node's unchanged one.
        const replaced = !group && this.#replaced(spec.name);
        const why = !go ? 'the node stops' : (this.#unloads.get(spec.name) ?? 0) !== unloads ? 'an operator unloaded it' : replaced ? 'an operator loaded that name meanwhile' : undefined;
        if (why !== undefined) {
          this.#log.info(fields, `model "${spec.name}" is not loaded again after its checkpoint files changed: ${why}`);
          return undefined;
        }
      }
    }
  }

  /** A version of that name serves or is being loaded, and is not a stale one. */
  #replaced(name: string): boolean {
    return this.#status().models.some((m) => m.name === name && m.stale === undefined && m.state !== 'draining' && m.state !== 'released' && m.state !== 'failed');
  }

  /** True once the node is ready with no load running; false once it stops. */
  #untilIdle(): Promise<boolean> {
    return new Promise((resolve) => {
      let ended = false;
      let sub: { unsubscribe(): void } | undefined;
      const check = () => {
        const snap = this.#actor.getSnapshot();
        const idle = snap.value === 'ready' && this.#loading === undefined && !this.#status().models.some((m) => LOADING_STATES.has(m.state));
        if (ended || (!this.#closed && snap.status === 'active' && !idle)) return;
        ended = true;
        sub?.unsubscribe();
        this.#wakers.delete(check);
        resolve(!this.#closed && snap.status === 'active');
      };
      check();
      if (ended) return;
      this.#wakers.add(check);
      // A stopped actor completes the subscription at once.
      sub = this.#actor.subscribe({ next: check, error: check, complete: check });
      if (ended) sub.unsubscribe();
    });
  }

  /** True after `ms`; false at once if the node stops first. */
  #after(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      // Woken with every load's end too: only the node's stop cuts the wait short.
      const wake = () => {
        if (!this.#closed) return;
        clearTimeout(timer);
        this.#wakers.delete(wake);
        resolve(false);
      };
      const timer = setTimeout(() => {
        this.#wakers.delete(wake);
        resolve(!this.#closed);
      }, ms);
      this.#wakers.add(wake);
    });
  }

  /**
   * Hands a planned model to the supervisor; resolves with its status once it serves. A load that
   * replaces older versions (PlannedModel.dropsOlderFirst), with a keeper, resolves only once the
   * keeper holds what its reply says: the older versions' records dropped before it serves
   * (#dropOlder), then its own ranks' keeps done, kept or refused (a checkpoint's version serves
   * unkept when refused, as any load: the rank's warning says so).
   */
  async #serve(planned: PlannedModel, name: string): Promise<ModelStatus> {
    this.#refuseUnlessReady('load');
    const id = modelLoadId(++this.#loads);
    this.#actor.send({ type: 'MODEL_LOAD', id, planned });
    const child = modelActor(this.#actor.getSnapshot(), id);
    if (!child) throw new WeightdError('E_LOAD_BUSY', `the node is ${this.#actor.getSnapshot().value} and did not take the load of "${name}"; try again once it is ready`);
    const swaps = planned.dropsOlderFirst === true && child.getSnapshot().context.keeper !== undefined;
    if (swaps) {
      this.#onceStarting(child, () => {
        // A bug here must fail this load, not leave it waiting in starting (nor reject unhandled).
        this.#serially(name, () => this.#dropOlder(id, child, name)).catch((err: unknown) =>
          child.send({ type: 'MODEL_OLDER_NOT_DROPPED', failure: { name: 'WeightdError', code: 'E_INTERNAL', message: `model "${name}" was not loaded: dropping the versions it replaces failed unexpectedly (${(err as Error).message})` } }),
        );
      });
    }
    await this.#untilServing(child, name);
    if (swaps) await this.#untilKeptOrNot(child);
    // The newest version of the fingerprint: one released or draining before may still be listed.
    return this.#versionsOf(name).findLast((m) => m.fingerprint === planned.plan.fingerprint)!;
  }

  /** Runs `then` once `child` is in starting (loaded, its files checked, not yet served); never if it ends first. */
  #onceStarting(child: ActorRefFrom<typeof modelMachine>, then: () => void): void {
    const sub = child.subscribe({
      next: (snap) => {
        if (snap.status === 'active' && snap.value !== 'starting') return;
        sub.unsubscribe();
        if (snap.status === 'active') then();
      },
      error: () => sub.unsubscribe(),
    });
  }

  /**
   * A load in starting (PlannedModel.dropsOlderFirst): the keeper drops the records of the
   * versions of its name it replaces (every one that serves now: they drain once it serves), and
   * then it may serve. When a drop fails (the keeper does not answer, or refuses), the versions
   * are kept again (each record as it was, the current one's currentSince included) and the load
   * fails with E_VERSION_NOT_KEPT: nothing of it serves, what served serves on, and a restart
   * finds what it would have found before. Run in #serially: no commit or rollback of the name
   * keeps a record between the drops and the serve.
   */
  async #dropOlder(id: string, child: ActorRefFrom<typeof modelMachine>, name: string): Promise<void> {
    const { context, value, status } = child.getSnapshot();
    if (value !== 'starting' || status !== 'active') return;
    const snap = this.#actor.getSnapshot();
    const older = modelEntries(snap)
      .filter((e) => e.name === name && e.id !== id && !e.unloaded && !e.gone)
      .flatMap((e) => modelActor(snap, e.id) ?? []);
    try {
      await dropSuperseded(context.keeper!.socket, older.map((o) => o.getSnapshot().context.planned));
    } catch (err) {
      await Promise.all(older.map((o) => this.#keepAgain(name, o, undefined).catch(() => {})));
      const stays = this.#versionsOf(name).find((m) => m.current);
      const versions = older.map((o) => o.getSnapshot().context.planned.version ?? 0);
      child.send({
        type: 'MODEL_OLDER_NOT_DROPPED',
        failure: {
          name: 'WeightdError',
          code: 'E_VERSION_NOT_KEPT',
          message:
            `model "${name}" was not loaded from ${context.planned.spec.modelDir}: ${(err as Error).message}, so a daemon restart would still serve the version${versions.length === 1 ? '' : 's'} it replaces (${versions.join(', ')}); ` +
            `nothing of it serves, and ${stays ? `version ${stays.version}` : 'the version that served'} stays current, kept again. Load it again once the keeper answers (weightd keeper status)`,
          details: { model: name, versions, ...(stays ? { current: stays.version } : {}) },
        },
      });
      return;
    }
    this.#log.debug({ name, versions: older.map((o) => o.getSnapshot().context.planned.version ?? 0) }, `model "${name}": the keeper dropped the versions the load replaces`);
    child.send({ type: 'MODEL_OLDER_DROPPED' });
  }

  /** Resolves once every rank of `child` that serves has a keep's outcome (RankStatus.kept), or `child` stops serving. */
  #untilKeptOrNot(child: ActorRefFrom<typeof modelMachine>): Promise<void> {
    const settled = (snap: ModelSnapshot) => snap.status !== 'active' || snap.value !== 'serving' || snap.context.ranks.every((r) => r.state === 'released' || r.kept !== undefined);
    if (settled(child.getSnapshot())) return Promise.resolve();
    return new Promise((resolve) => {
      const sub = child.subscribe({
        next: (snap) => settled(snap) && (sub.unsubscribe(), resolve()),
        error: () => (sub.unsubscribe(), resolve()),
        complete: resolve,
      });
    });
  }

  #evict(policy: Exclude<EvictionPolicy, 'off'>, refused: WeightdError, name: string): Promise<LoadResult['evicted']> {
    return evictForLoad({
      policy,
      refused,
      name,
      status: this.#status,
      unload: (fingerprint) => this.unload(fingerprint),
      dropProcessed: this.#dropProcessed,
      // The node's state, and its models' list (a model released or gone), each change the status.
      onChange: (listener) => {
        const subs = [this.#actor, modelRegistry(this.#actor.getSnapshot())].map((a) => a?.subscribe({ next: listener, error: listener }));
        return () => subs.forEach((s) => s?.unsubscribe());
      },
      log: this.#log,
    });
  }

  unload(target: string, { force = false }: { force?: boolean } = {}): UnloadResult {
    this.#refuseUnlessReady('unload');
    const models = this.#status().models;
    const live = models.filter((m) => m.state !== 'draining' && m.state !== 'released' && m.state !== 'failed');
    const matches = (m: ModelStatus) => m.name === target || m.fingerprint === target;
    // A forced unload may also cut short a drain that waits on leases.
    const chosen = (force ? models.filter((m) => m.state === 'draining' || live.includes(m)) : live).filter(matches);
    // Also when only a stale version, already draining, has that name: its reload stops being retried.
    for (const name of new Set([target, ...chosen.map((m) => m.name)])) this.#unloads.set(name, (this.#unloads.get(name) ?? 0) + 1);
    if (chosen.length === 0) {
      const loaded = live.map((m) => `${m.name} (${m.fingerprint?.slice(0, 12) ?? '?'}…, tp ${m.tpSize})`);
      throw new WeightdError('E_UNKNOWN_MODEL', `no loaded model is named or fingerprinted "${target}"; loaded: ${loaded.join(', ') || 'none'}`, { target, loaded: live.map((m) => m.name) });
    }
    const entries = modelEntries(this.#actor.getSnapshot()).filter((e) => !e.gone);
    const ids = entries.filter((e) => chosen.some((m) => m.fingerprint === e.fingerprint)).map((e) => e.id);
    this.#log.info({ target, force, models: chosen.map((m) => m.name) }, force ? 'unload (forced): revoking leases and freeing' : 'unload: draining until the last lease ends');
    this.#actor.send({ type: 'MODEL_UNLOAD', ids, force });
    return { unloaded: chosen.map((m) => ({ name: m.name, fingerprint: m.fingerprint ?? '', leases: m.leases })), force };
  }

  /** A model that would span the group and cannot be planned here fails its swap on every node now. */
  async #plan(spec: ModelSpec): Promise<PlannedModel> {
    try {
      const planned = await planModel(spec, this.#config, this.#log);
      // Across nodes the group's commit decides when it serves (docs/multi-node.md): not gated here.
      return { ...planned, origin: 'load', ...(planned.placement.nnodes === 1 ? { dropsOlderFirst: true } : {}) };
    } catch (err) {
      if (spansGroup(spec.tpSize, this.#config)) this.#actor.send({ type: 'MODEL_PLAN_FAILED', name: spec.name, error: serializeError(err as Error) });
      throw err;
    }
  }

  #refuseUnlessReady(what: string): void {
    const state = this.#actor.getSnapshot().value;
    if (state !== 'ready') throw new WeightdError('E_LOAD_BUSY', `the node is ${state}: it can ${what} a model only once ready`, { state });
  }

  /**
   * Joins the swap across the group of a version this node serves already, as resident at once:
   * node 0 commits it once every node has it (the others load it), or aborts it on every node.
   * Resolves on the commit; rejects with the abort's error, or when the node stops first.
   */
  #vouch(planned: PlannedModel): Promise<void> {
    const { name, tpSize } = planned.spec;
    const { fingerprint, fingerprintFields } = planned.plan;
    const id = `vouch-${++this.#vouches}`;
    const registry = modelRegistry(this.#actor.getSnapshot())!;
    this.#log.info({ name, fingerprint }, `model "${name}": this node serves that version already; it joins its swap across the group as resident`);
    this.#actor.send({ type: 'MODEL_GROUP_VOUCH', id, join: { name, fingerprint, fingerprintFields, tpSize } });
    return new Promise((resolve, reject) => {
      const check = () => {
        const snap = registry.getSnapshot();
        const verdict = snap.context.vouched.find((v) => v.id === id)?.verdict;
        if (verdict === undefined && snap.status === 'active' && snap.value === 'running') return;
        sub.unsubscribe();
        if (verdict === undefined) reject(new WeightdError('E_STOPPED', `the node stopped before node 0's verdict on the swap of model "${name}" across the group`));
        else if ('committed' in verdict) resolve();
        else reject(new RankFailedError(receivedCode(verdict.error.code), modelFailureMessage(name, verdict.error), { ...verdict.error.details, model: name }));
      };
      const sub = registry.subscribe({ next: check, error: (err) => reject(err as Error) });
      check();
    });
  }

  /** Resolves when the model actor serves; rejects with its failure when it ends first. */
  #untilServing(child: ActorRefFrom<typeof modelMachine>, name: string): Promise<void> {
    return new Promise((resolve, reject) => {
      const check = (snap: ModelSnapshot) => {
        if (snap.value === 'serving' || snap.value === 'draining') {
          sub.unsubscribe();
          resolve();
        } else if (snap.status !== 'active') {
          sub.unsubscribe();
          const f = snap.context.failure;
          reject(f ? new RankFailedError(receivedCode(f.code), modelFailureMessage(name, f), { ...f.details, model: name }) : new WeightdError('E_STOPPED', `model "${name}" was stopped before it served`));
        }
      };
      const sub = child.subscribe({ next: check, error: (err) => reject(err as Error) });
      check(child.getSnapshot());
    });
  }
}

/** The retried load's failure, saying what was evicted before it (that is not undone). */
function evictedFirst(err: unknown, evicted: LoadResult['evicted']): unknown {
  if (!(err instanceof WeightdError)) return err;
  const names = evicted.map((e) => `"${e.name}"`).join(', ');
  return new WeightdError(err.code, `${err.message} (after evicting ${names}, which stay unloaded)`, { ...err.details, evicted });
}

/** A planned model's version number (PlannedModel.version: absent for a checkpoint, 0); undefined without one. */
function versionOf(planned: PlannedModel | undefined): number | undefined {
  return planned && (planned.version ?? 0);
}
