// One model version the node serves: a child of the supervisor with its own lifecycle. The
// node's first model (the one its group forms around) is one too, joined as FORMS_GROUP says.
// It holds no I/O: its rank and serve actors are typed placeholders that the composition root
// (src/actors/nodeActors.ts) or a test supplies through .provide().
//
//   admitting: each rank opens its device and reports its free memory; nothing is allocated
//              until every rank has, and the model is refused (failed) when it does not fit.
//              The node's first model is admitted at once (ModelJoin.awaitAdmission).
//   loading:   the ranks allocate and fill.
//   verifying: the checkpoint files are checked to be the ones planned (a directory rewritten
//              meanwhile fails this load alone).
//   resident:  only for a model that spans the group (and not the one the group formed around,
//              ModelJoin.awaitCommit): resident here but not attachable until
//              node 0 commits it (resident on every node) or aborts it (it failed somewhere;
//              then it is freed). An abort can come in any state before this one too.
//   starting:  each rank is served on its device's socket (shared with the other models); the
//              supervisor hears it (MODEL_STARTING: the node's own "starting"). A version a
//              writer committed, with a keeper, is kept here first (keptBeforeServing), and fails
//              when a rank's keep does. A load that replaces older versions of its name
//              (PlannedModel.dropsOlderFirst), with a keeper, waits here until the model control
//              had the keeper drop their records, and fails when it could not.
//   serving:   attachable; watchers hear model_ready. Its checkpoint files changed (a rank's
//              server found it, src/serve/filesCheck.ts): it is stale, and drains at once while
//              the supervisor loads it again.
//   draining:  unloaded, or a newer version serves: no new lease, and no longer kept; freed
//              when the last lease ends, or at once when forced (the holders hear lease_revoked).
//   released:  every rank's memory is freed. The supervisor then ends the actor (its servers go,
//              and the version leaves its sockets), except the node's first model's: its
//              servers answer "released" until the node stops, as a one-model daemon's did.
//   stopping:  the node stops: servers go first, then each rank frees its device.
//   failing:   with a keeper, what it holds of a model that failed is dropped (its ranks may have
//              adopted or kept it), then failed; a model refused before any rank allocated, one
//              without a keeper, or the node's first model (ModelJoin.dropKeptOnFailure), fails at once.
import { and, not, or, assertEvent, assign, enqueueActions, fromCallback, fromPromise, sendTo, setup, type AnyActorRef, type StateValueFrom } from 'xstate';
import type { FileIdentity, IdentityChange } from '../files/fileIdentity.js';
import type { PlannedModel } from './planModel.js';
import type { RankActorInput, RankCommand } from './rankContract.js';
import type { RankKeeping } from './rankMessages.js';
import type { ServerRegistry } from '../serve/serverRegistry.js';
import type { WorkerRegistry } from './workerRegistry.js';
import { WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import type { DropModelShardsInput } from './dropModelShards.js';
import type { CudaHandles } from '../native/addon.js';
import type { ModelMachineState, NodeFailure, RankStatus, SameStateNames } from '../nodeStatus.js';
import type { NodeManifestEntry } from '../wire/nodeManifest.js';
import type { ServeCommand, ServeEvent, RankServiceInput } from '../serve/serveEvents.js';
import type { RankEvent } from './rankContract.js';
import { formatGiB, modelPools, modelShortfall } from './modelFit.js';
import { recordReport, updateRank } from './rankUpdates.js';
import { rankActorId, rankActorInput, serveActorId, rankServiceInput, type ModelRanks } from './modelRanks.js';

/**
 * How a model joins the node. A model loaded beside others (LOADED_BESIDE) is admitted against
 * what is resident and, spanning the group, committed by node 0; the node's first model
 * (FORMS_GROUP) is the one the rendezvous formed the group around, and loads as it did before
 * several models existed.
 */
export interface ModelJoin {
  /** Its ranks wait for admission (every rank opened, and the model fits) before they allocate; false: they allocate once their device is open. */
  awaitAdmission: boolean;
  /** Its ranks hand the keeper their segments once it serves; false: once exported (RankWorkerData.keepOnceServing). */
  keepOnceServing: boolean;
  /** Spanning the group, it waits in resident for node 0's commit; false: the rendezvous formed the group around it, and the node's ready barrier stands for the commit. */
  awaitCommit: boolean;
  /** A failure drops what the keeper holds of it (failing); false: the keeper keeps it for the node's next start. */
  dropKeptOnFailure: boolean;
}

export const LOADED_BESIDE: ModelJoin = { awaitAdmission: true, keepOnceServing: true, awaitCommit: true, dropKeptOnFailure: true };
export const FORMS_GROUP: ModelJoin = { awaitAdmission: false, keepOnceServing: false, awaitCommit: false, dropKeptOnFailure: false };

/** What every model's ranks run with on this node: the registry holds it and hands it to each model it spawns. */
export interface ModelHostInput {
  socketDir: string;
  cudaHandles: CudaHandles;
  /** Where the ranks keep their segments beyond the daemon (absent: --keeper off). */
  keeper?: RankKeeping;
  log: Logger;
  rankWorker: URL;
  workers: WorkerRegistry;
  servers: ServerRegistry;
}

export interface ModelInput extends ModelHostInput {
  /** The child's id in the supervisor, which its events to the parent carry. */
  id: string;
  /**
   * Who hears MODEL_SERVING, MODEL_FAILED and MODEL_GONE: the supervisor. An input rather than
   * sendParent, so that xstate/graph can walk the machine alone (test/models/modelMachine.paths).
   */
  parent: AnyActorRef;
  planned: PlannedModel;
  /** Started with the node (its failure fails the node) rather than loaded later. */
  startup: boolean;
  /** How it joins the node (default LOADED_BESIDE). */
  join?: ModelJoin;
}

export interface ModelContext extends ModelInput {
  join: ModelJoin;
  ranks: RankStatus[];
  failure?: NodeFailure;
  /** The unload was forced: leases are revoked instead of waited for. */
  force: boolean;
  /** Local ranks that will adopt a kept shard: judged at admission as needing no new memory. */
  adoptable: number[];
  /** Its checkpoint files changed since it was planned, and how (the first rank to report it). */
  stale?: { changes: IdentityChange[]; described: string; since: number };
  /** PlannedModel.dropsOlderFirst: the keeper no longer holds the records of the versions it replaces (MODEL_OLDER_DROPPED). */
  olderDropped: boolean;
}

export type ModelCommand =
  | { type: 'MODEL_UNLOAD'; force: boolean }
  | { type: 'MODEL_STOP' }
  /** A model that spans the group: node 0 found it resident on every node. */
  | { type: 'MODEL_COMMIT' }
  /** A model that spans the group failed on another node (or node 0 is gone): free it. */
  | { type: 'MODEL_ABORT'; error: NodeFailure }
  /** The node's keeper answers again: each rank hands it its segments again (if it may keep them). */
  | { type: 'KEEPER_BACK'; currentSince?: number }
  /** A rollback to this retained version: its ranks become the newest of its name, and watchers hear model_ready. */
  | { type: 'MODEL_PROMOTE' }
  /** PlannedModel.dropsOlderFirst: the keeper dropped the records of the versions this one replaces; it may serve. */
  | { type: 'MODEL_OLDER_DROPPED' }
  /** PlannedModel.dropsOlderFirst: the keeper did not drop them (the model control kept them again): it fails with this. */
  | { type: 'MODEL_OLDER_NOT_DROPPED'; failure: NodeFailure };

/**
 * What the model actor emits for whoever follows it (ModelControl): each rank's keep, or failed
 * keep, as the rank reported it (currentSince: what its record carried).
 */
export type ModelEmitted = Extract<RankEvent, { type: 'RANK_KEPT' }>;

/**
 * A version a writer committed, served with a keeper: its ranks keep it before it is announced,
 * and it fails when one is not kept. No file holds its bytes, so a commit answered before the
 * keeper holds them would be lost with the daemon (docs/weight-updates.md).
 */
const keptBeforeServing = (context: ModelContext) => context.keeper !== undefined && context.planned.origin === 'update' && context.join.keepOnceServing;

/** The tag of the states in which a model holds memory it is still filling (modelControl allows one such load at a time). */
export const LOAD_RUNNING = 'loadRunning';

function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the model machine's "${name}" actor was not provided; create it with .provide({ actors }) (startNode uses src/actors/nodeActors.ts)`);
}

export const modelActors = {
  rank: fromCallback<RankCommand, RankActorInput, RankEvent>(() => notProvided('rank')),
  checkFiles: fromPromise<void, { files: FileIdentity[] }>(() => notProvided('checkFiles')),
  dropModelShards: fromPromise<void, DropModelShardsInput>(() => notProvided('dropModelShards')),
  rankService: fromCallback<ServeCommand, RankServiceInput, ServeEvent>(() => notProvided('rankService')),
};

/** Every line a rank's actors log carries its global and local rank (the model's log names the model). */
const rankLog = (context: ModelContext, r: RankStatus) => context.log.child({ globalRank: r.globalRank, localRank: r.localRank });

/** A failure once its ranks may hold memory the keeper has too: through failing, where the keeper's copies are to go. */
const failWith = <A extends string>(actions: A) => [{ guard: 'dropsKept', target: '#model.failing', actions }, { target: '#model.failed', actions }] as const;

/** Another node failed it, or node 0 is gone: it fails here too, and is freed. */
const aborted = failWith('recordAbort');

/** A rank's memory is freed through its worker once its server allows it (a drain's end, or a client's release). */
const clientRelease = {
  RANK_RELEASE_REQUESTED: { actions: 'releaseRank' },
  RANK_RELEASED: { actions: 'recordReleased' },
} as const;

export const modelMachine = setup({
  types: {
    context: {} as ModelContext,
    events: {} as RankEvent | ServeEvent | ModelCommand,
    input: {} as ModelInput,
    tags: {} as typeof LOAD_RUNNING,
    emitted: {} as ModelEmitted,
  },
  actors: modelActors,
  guards: {
    allRanksOpened: ({ context }) => context.ranks.every((r) => r.device !== undefined),
    fits: ({ context }) => modelShortfall(needs(context)) === undefined,
    allRanksLoaded: ({ context }) => context.ranks.every((r) => r.state === 'loaded'),
    // A rank's socket is live before its siblings' are, so a client may already have released it.
    allRanksServing: ({ context }) => context.ranks.every((r) => r.state === 'serving' || r.state === 'released'),
    allRanksReleased: ({ context }) => context.ranks.every((r) => r.state === 'released'),
    allRanksStopped: ({ context }) => context.ranks.every((r) => r.state === 'stopped'),
    awaitsAdmission: ({ context }) => context.join.awaitAdmission,
    awaitsCommit: ({ context }) => context.planned.placement.nnodes > 1 && context.join.awaitCommit,
    isStale: ({ context }) => context.stale !== undefined,
    dropsKept: ({ context }) => context.keeper !== undefined && context.join.dropKeptOnFailure,
    keptBeforeServing: ({ context }) => keptBeforeServing(context),
    allRanksKept: ({ context }) => context.ranks.every((r) => r.kept === true || r.state === 'released'),
    notKeptBeforeServing: ({ context, event }) => event.type === 'RANK_KEPT' && !event.kept && keptBeforeServing(context),
    olderDropped: ({ context }) => context.planned.dropsOlderFirst !== true || context.keeper === undefined || context.olderDropped,
  },
  actions: {
    spawnRanks: enqueueActions(({ context, enqueue }) => {
      const phases = { keeper: context.keeper, awaitAdmission: context.join.awaitAdmission, keepOnceServing: context.join.keepOnceServing };
      for (const r of context.ranks) {
        enqueue.spawnChild('rank', { id: rankActorId(r.localRank), input: rankActorInput(ranksOf(context), r, context, rankLog(context, r), phases) });
      }
    }),
    admitRanks: enqueueActions(({ context, enqueue }) => {
      if (!context.join.awaitAdmission) return;
      for (const r of context.ranks) enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_ADMIT' });
    }),
    recordShortfall: assign(({ context }) => {
      const s = modelShortfall(needs(context))!;
      const { name } = context.planned.spec;
      return {
        failure: {
          name: 'DeviceError',
          code: 'E_DOES_NOT_FIT',
          message:
            `model "${name}" does not fit beside what is resident: its ranks need ${s.neededBytes} bytes (${formatGiB(s.neededBytes)}) of ${s.pool}, ` +
            `which has ${s.freeBytes} bytes (${formatGiB(s.freeBytes)}) free; nothing was allocated. Unload a model (weightd ctl unload) or load it at a smaller share per device`,
          // Every pool, short or not: what an eviction policy (src/models/evictionPolicy.ts) makes room in.
          details: { model: name, pool: s.pool, neededBytes: s.neededBytes, freeBytes: s.freeBytes, pools: modelPools(needs(context)) },
        },
      };
    }),
    recordFilesChanged: assign(({ context, event }) => {
      const e = (event as unknown as { error: WeightdError }).error;
      return { failure: { name: e.name, code: e.code ?? 'E_FILE_CHANGED', message: `model "${context.planned.spec.name}": ${e.message}`, details: e.details } };
    }),
    // What a rank's reports change in its row (models/rankUpdates.ts).
    recordDevice: assign(({ context, event }) => {
      assertEvent(event, 'RANK_DEVICE');
      return { ranks: recordReport(context.ranks, event), adoptable: event.adoptable ? [...context.adoptable, event.localRank] : context.adoptable };
    }),
    recordProgress: assign(({ context, event }) => (assertEvent(event, 'RANK_PROGRESS'), { ranks: recordReport(context.ranks, event) })),
    recordLoaded: assign(({ context, event }) => (assertEvent(event, 'RANK_LOADED'), { ranks: recordReport(context.ranks, event) })),
    // A check that ends before the rank's server is spawned is in its row (rankServiceInput); after, its server hears it.
    recordDescriptorsChecked: enqueueActions(({ context, event, enqueue, self }) => {
      assertEvent(event, 'RANK_DESCRIPTORS_CHECKED');
      enqueue.assign({ ranks: recordReport(context.ranks, event) });
      const id = serveActorId(event.localRank);
      if (self.getSnapshot().children[id]) enqueue.sendTo(id, { type: 'SERVE_DESCRIPTORS_CHECKED', ...(event.error ? { error: event.error } : {}) });
    }),
    recordKept: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'RANK_KEPT');
      enqueue.assign({ ranks: recordReport(context.ranks, event) });
      enqueue.emit(event);
    }),
    recordNotKept: assign(({ context, event }) => {
      assertEvent(event, 'RANK_KEPT');
      const r = context.ranks.find((x) => x.localRank === event.localRank);
      const { version } = context.planned;
      return {
        failure: context.failure ?? {
          name: 'WeightdError',
          code: 'E_VERSION_NOT_KEPT',
          message:
            `version ${version} was not served: the keeper did not keep rank ${r?.globalRank ?? '?'}'s shard (${event.reason ?? 'no reason given'}), and a written version serves only once kept, ` +
            'since no file holds its bytes and a daemon restart would lose it; nothing of it serves. Commit again once the keeper answers (weightd keeper status)',
          details: { version, localRank: event.localRank, reason: event.reason },
        },
      };
    }),
    // In starting for a version kept before it serves, in serving for any other kept once it serves.
    keepRanks: enqueueActions(({ context, enqueue }, beforeServing: boolean) => {
      if (!context.join.keepOnceServing || keptBeforeServing(context) !== beforeServing) return;
      for (const r of context.ranks) if (r.state !== 'released') enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_KEEP' });
    }),
    keepRanksAgain: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'KEEPER_BACK');
      const currentSince = event.currentSince;
      for (const r of context.ranks) enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_KEEP_AGAIN', ...(currentSince !== undefined ? { currentSince } : {}) });
    }),
    // A draining model is not to come back at a restart: the keeper lets go of it now, while its ranks serve the last leases.
    unkeepRanks: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) if (r.state !== 'released') enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_UNKEEP' });
    }),
    spawnServers: enqueueActions(({ context, enqueue }) => {
      const serve = { socketDir: context.socketDir, servers: context.servers, version: context.id };
      for (const r of context.ranks) enqueue.spawnChild('rankService', { id: serveActorId(r.localRank), input: rankServiceInput(ranksOf(context), r, serve, rankLog(context, r)) });
    }),
    recordStale: assign(({ context, event }) => {
      assertEvent(event, 'RANK_STALE');
      return { stale: context.stale ?? { changes: event.changes, described: event.described, since: Date.now() } };
    }),
    tellParentStale: sendTo(({ context }) => context.parent, ({ context }) => ({ type: 'MODEL_STALE', id: context.id, spec: context.planned.spec, changes: context.stale!.changes, described: context.stale!.described })),
    recordServing: assign(({ context, event }) => {
      assertEvent(event, 'RANK_SERVING');
      return { ranks: updateRank(context.ranks, event.localRank, { state: 'serving', socketPath: event.socketPath }) };
    }),
    announce: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) enqueue.sendTo(serveActorId(r.localRank), { type: 'SERVE_ANNOUNCE' });
      // Every local rank digests the whole checkpoint: any one's digests are the model's.
      enqueue.sendTo(context.parent, { type: 'MODEL_SERVING', id: context.id, entries: manifestEntries(context), digests: context.ranks[0]?.digests });
    }),
    promote: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) enqueue.sendTo(serveActorId(r.localRank), { type: 'SERVE_PROMOTE' });
    }),
    storeForce: assign(({ event }) => {
      assertEvent(event, 'MODEL_UNLOAD');
      return { force: event.force };
    }),
    drain: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) enqueue.sendTo(serveActorId(r.localRank), { type: 'SERVE_DRAIN', force: context.force });
    }),
    releaseRank: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'RANK_RELEASE_REQUESTED');
      enqueue.sendTo(rankActorId(event.localRank), { type: 'RANK_RELEASE' });
    }),
    recordReleased: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'RANK_RELEASED');
      enqueue.assign({ ranks: updateRank(context.ranks, event.localRank, { state: 'released', bytes: 0 }) });
      enqueue.sendTo(serveActorId(event.localRank), { type: 'SERVE_RELEASED' });
    }),
    // Servers go first so no client attaches to memory that is about to be freed.
    stopRanks: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) {
        enqueue.stopChild(serveActorId(r.localRank));
        if (r.state !== 'released') enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_STOP' });
      }
      enqueue.assign({ ranks: context.ranks.map((r) => (r.state === 'released' ? { ...r, state: 'stopped' as const } : r)) });
    }),
    recordStopped: assign(({ context, event }) => {
      assertEvent(event, 'RANK_STOPPED');
      return { ranks: updateRank(context.ranks, event.localRank, { state: 'stopped' }) };
    }),
    recordRankFailure: assign(({ context, event }) => {
      assertEvent(event, 'RANK_FAILED');
      return {
        ranks: updateRank(context.ranks, event.localRank, { state: 'failed' }),
        failure: context.failure ?? rankFailure(context.ranks, event.localRank, event.error),
      };
    }),
    recordOlderDropped: assign({ olderDropped: true }),
    recordOlderNotDropped: assign(({ context, event }) => {
      assertEvent(event, 'MODEL_OLDER_NOT_DROPPED');
      return { failure: context.failure ?? event.failure };
    }),
    recordAbort: assign(({ context, event }) => {
      assertEvent(event, 'MODEL_ABORT');
      return { failure: context.failure ?? event.error };
    }),
    tellParentStarting: sendTo(({ context }) => context.parent, ({ context }) => ({ type: 'MODEL_STARTING', id: context.id })),
    tellParentResident: sendTo(({ context }) => context.parent, ({ context }) => ({ type: 'MODEL_RESIDENT', id: context.id })),
    tellParentFailed: sendTo(({ context }) => context.parent, ({ context }) => ({ type: 'MODEL_FAILED', id: context.id, error: context.failure! })),
    tellParentGone: sendTo(({ context }) => context.parent, ({ context }) => ({ type: 'MODEL_GONE', id: context.id })),
  },
}).createMachine({
  id: 'model',
  initial: 'admitting',
  context: ({ input }) => ({
    ...input,
    join: input.join ?? LOADED_BESIDE,
    force: false,
    adoptable: [],
    olderDropped: false,
    ranks: input.planned.devices.map((_, localRank) => {
      const globalRank = input.planned.placement.nodeRank * input.planned.placement.localWorldSize + localRank;
      return { localRank, globalRank, state: 'starting' as const, bytes: 0, totalBytes: input.planned.plan.ranks[globalRank]!.totalBytes, seconds: 0 };
    }),
  }),
  states: {
    admitting: {
      tags: LOAD_RUNNING,
      entry: 'spawnRanks',
      on: { RANK_DEVICE: { actions: 'recordDevice' }, MODEL_STOP: '#model.stopping', MODEL_ABORT: aborted },
      always: [
        { guard: not('awaitsAdmission'), target: 'loading' },
        { guard: and(['allRanksOpened', 'fits']), target: 'loading' },
        { guard: 'allRanksOpened', target: 'failed', actions: 'recordShortfall' },
      ],
    },
    loading: {
      tags: LOAD_RUNNING,
      entry: 'admitRanks',
      // A model admitted at once hears its ranks open their devices here.
      on: { RANK_DEVICE: { actions: 'recordDevice' }, RANK_PROGRESS: { actions: 'recordProgress' }, RANK_LOADED: { actions: 'recordLoaded' }, MODEL_STOP: '#model.stopping', MODEL_ABORT: aborted },
      always: { guard: 'allRanksLoaded', target: 'verifying' },
    },
    verifying: {
      tags: LOAD_RUNNING,
      invoke: {
        id: 'checkFiles',
        src: 'checkFiles',
        input: ({ context }) => ({ files: context.planned.plan.files }),
        onDone: [{ guard: 'awaitsCommit', target: 'resident' }, { target: 'starting' }],
        onError: failWith('recordFilesChanged'),
      },
      on: { MODEL_STOP: '#model.stopping', MODEL_ABORT: aborted },
    },
    resident: {
      tags: LOAD_RUNNING,
      entry: 'tellParentResident',
      on: { MODEL_COMMIT: 'starting', MODEL_ABORT: aborted, MODEL_STOP: '#model.stopping' },
    },
    starting: {
      tags: LOAD_RUNNING,
      entry: ['spawnServers', 'tellParentStarting', { type: 'keepRanks', params: true }],
      // A rank's socket is live before its siblings' are, so a client may already release.
      on: {
        RANK_SERVING: { actions: 'recordServing' },
        RANK_KEPT: [
          { guard: and(['notKeptBeforeServing', 'dropsKept']), target: '#model.failing', actions: ['recordKept', 'recordNotKept'] },
          { guard: 'notKeptBeforeServing', target: '#model.failed', actions: ['recordKept', 'recordNotKept'] },
          { actions: 'recordKept' },
        ],
        MODEL_OLDER_DROPPED: { actions: 'recordOlderDropped' },
        MODEL_OLDER_NOT_DROPPED: failWith('recordOlderNotDropped'),
        ...clientRelease,
        MODEL_STOP: '#model.stopping',
      },
      always: { guard: and(['allRanksServing', or([not('keptBeforeServing'), 'allRanksKept']), 'olderDropped']), target: 'serving' },
    },
    serving: {
      entry: ['announce', { type: 'keepRanks', params: false }],
      on: {
        MODEL_UNLOAD: { target: 'draining', actions: 'storeForce' },
        MODEL_PROMOTE: { actions: 'promote' },
        RANK_STALE: { target: 'draining', actions: ['recordStale', 'tellParentStale'] },
        ...clientRelease,
        MODEL_STOP: '#model.stopping',
      },
      always: [
        // Every rank released by its clients (the release command): nothing is left to serve.
        { guard: 'allRanksReleased', target: 'released' },
        // Found stale while its ranks were still being bound.
        { guard: 'isStale', target: 'draining', actions: 'tellParentStale' },
      ],
    },
    draining: {
      entry: ['drain', 'unkeepRanks'],
      on: { MODEL_UNLOAD: { actions: ['storeForce', 'drain'] }, ...clientRelease, MODEL_STOP: '#model.stopping' },
      always: { guard: 'allRanksReleased', target: 'released' },
    },
    // Not final: its servers stay until the supervisor ends it (above).
    released: { entry: 'tellParentGone' },
    stopping: {
      entry: 'stopRanks',
      // The node stops: a rank failing now leaves the keeper's copies for its next start.
      on: { RANK_STOPPED: { actions: 'recordStopped' }, RANK_FAILED: { target: 'failed', actions: 'recordRankFailure' } },
      always: { guard: 'allRanksStopped', target: 'stopped' },
    },
    stopped: { type: 'final', entry: 'tellParentGone' },
    failing: {
      invoke: {
        id: 'dropModelShards',
        src: 'dropModelShards',
        input: ({ context }) => ({ socket: context.keeper!.socket, planned: context.planned, log: context.log }),
        onDone: 'failed',
        onError: 'failed',
      },
      // The first failure is the model's; a node that stops meanwhile keeps what the keeper holds (its next start sorts it out).
      on: { RANK_FAILED: { actions: 'recordRankFailure' }, MODEL_STOP: '#model.stopping' },
    },
    failed: { type: 'final', entry: 'tellParentFailed' },
  },
  on: {
    RANK_FAILED: failWith('recordRankFailure'),
    RANK_DESCRIPTORS_CHECKED: { actions: 'recordDescriptorsChecked' },
    // A keeper takes, loses or drops a rank's segments in any state a rank lives in.
    RANK_KEPT: { actions: 'recordKept' },
    RANK_STALE: { actions: 'recordStale' },
    // Its ranks live from admitting to the end: each decides whether the keeper may have its segments.
    KEEPER_BACK: { actions: 'keepRanksAgain' },
  },
});

// The status's ModelMachineState names exactly these states.
true satisfies SameStateNames<StateValueFrom<typeof modelMachine>, ModelMachineState>;

/** Its ranks, as planned and placed. */
function ranksOf(context: ModelContext): ModelRanks {
  const { spec, plan, devices, fill, placement, written, version } = context.planned;
  return { name: spec.name, plan, devices, fill, nodeRank: placement.nodeRank, nnodes: placement.nnodes, written, version };
}

/** What each rank will allocate on its device, as opened: nothing for one that adopts a kept shard. */
function needs(context: ModelContext) {
  const bytes = (r: RankStatus) => (context.adoptable.includes(r.localRank) ? 0 : context.planned.plan.ranks[r.globalRank]!.segments.reduce((a, b) => a + b, 0));
  return context.ranks.map((r) => ({ localRank: r.localRank, bytes: bytes(r), device: r.device! }));
}

/** A rank's failure, naming the rank as the node's failure and its peers always have (said of the model, it names the model too: modelFailureMessage). */
function rankFailure(ranks: RankStatus[], localRank: number, error: NodeFailure): NodeFailure {
  const globalRank = ranks.find((r) => r.localRank === localRank)?.globalRank;
  return { ...error, localRank, globalRank, message: `rank ${globalRank ?? '?'} (local ${localRank}) failed: ${error.message}` };
}

function manifestEntries(context: ModelContext): NodeManifestEntry[] {
  return context.ranks.map((r) => ({
    globalRank: r.globalRank,
    localRank: r.localRank,
    socketPath: r.socketPath!,
    deviceUuid: r.device!.uuid,
    fingerprint: context.planned.plan.ranks[r.globalRank]!.fingerprint,
  }));
}
