// The node's lifecycle as a state machine. It holds no I/O: setup() declares each actor as a
// typed placeholder, and the composition root (startNode, with src/actors/nodeActors.ts) or a
// test supplies the implementations through .provide(). Importing the machine therefore loads
// no addon, so the CLI can draw the chart on a machine where the addon is not built.
import { and, assertEvent, assign, enqueueActions, fromCallback, fromPromise, setup, type AnyActorRef, type StateValueFrom } from 'xstate';
import type { PlannedModel } from '../models/planModel.js';
import type { GroupSessionInput, PrepareInput, Prepared, PublishCommand, PublishNodeManifestInput, ReportStartupFailureInput } from './supervisorActors.js';
import type { RankActorInput, RankCommand } from '../models/rankContract.js';
import { nodeContent } from '../rendezvous/nodeContent.js';
import { OWN_VERSION } from '../serve/servedRankData.js';
import type { ServerRegistry } from '../serve/serverRegistry.js';
import type { WorkerRegistry } from '../models/workerRegistry.js';
import { WeightdError, type SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import type { NodeConfig } from '../nodeOptions.js';
import type { GroupFormation, NodeFailure, NodeState, PeerStatus, RankStatus, SameStateNames } from '../nodeStatus.js';
import type { GroupCommand, GroupEvent } from '../rendezvous/groupEvents.js';
import type { RankTableEntry } from '../wire/rankTable.js';
import type { ServeCommand, ServeEvent, RankServiceInput } from '../serve/serveEvents.js';
import type { SupervisorEvent } from './events.js';
import type { ModelEntry } from '../models/modelHost.js';
import type { RankEvent } from '../models/rankContract.js';
import { modelMachine, type ModelInput } from '../models/modelMachine.js';
import type { NodeManifestEntry, NodeManifestModel } from '../wire/nodeManifest.js';
import { recordReport, updateRank } from '../models/rankUpdates.js';
import { rankActorId, rankActorInput, serveActorId, rankServiceInput, type ModelRanks } from '../models/modelRanks.js';
import { keptLoadOf } from '../models/keptLoad.js';
import type { IdentityChange } from '../files/fileIdentity.js';
import type { ModelSpec } from '../models/modelSpecs.js';

export interface SupervisorInput {
  config: NodeConfig;
  log: Logger;
  /** The module each rank actor's worker thread runs (RankActorInput.worker). */
  rankWorker: URL;
  workers: WorkerRegistry;
  servers: ServerRegistry;
  /**
   * The node's keeper (absent with --keeper off): its socket, and a promise that settles once it
   * was found or started (or found missing). Preparing the node waits for it after planning, so
   * the ranks can adopt what it holds.
   */
  keeper?: { socket: string; ready: Promise<void> };
}

export interface SupervisorContext extends SupervisorInput {
  prepared?: Prepared;
  /** The models served besides the node's own, oldest first (src/models/modelMachine.ts). */
  models: ModelEntry[];
  /** The node's own model was unloaded or superseded: its ranks drain, then are released. */
  ownDrained: boolean;
  /** The node's own model's checkpoint files changed since it was planned (it drains, and is loaded again). */
  ownStale?: { changes: IdentityChange[]; described: string; since: number };
  /** Counts the model actors spawned with the node, for their ids (one loaded later is named by its MODEL_LOAD). */
  modelsSpawned: number;
  rankTable: RankTableEntry[];
  ranks: RankStatus[];
  failure?: NodeFailure;
  /** Every node of the group has reported ready (always true soon after ready on one node). */
  groupReady: boolean;
  /** The group session actor exists (from rendezvous on). */
  groupJoined: boolean;
  /** Other nodes seen lost or back while serving. */
  peers: PeerStatus[];
  /** During rendezvous, once node 0 answered: who has joined and who is still missing. */
  formation?: GroupFormation;
  /** On node 0: the rendezvous coordinator's state. */
  coordinatorState?: string;
}

export const GROUP_ACTOR_ID = 'group';

export const modelActorId = (n: number) => `model-${n}`;
/** How long ranks get to free their devices after STOP before the node gives up on them. */
export const STOP_TIMEOUT_MS = 30_000;

/** Every line a rank's actors log carries its global and local rank. */
function rankLog(context: SupervisorContext, r: RankStatus): Logger {
  return context.log.child({ globalRank: r.globalRank, localRank: r.localRank });
}

/** A placeholder's body: running the machine without providing that actor is a wiring bug. */
function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the supervisor's "${name}" actor was not provided; create the machine with .provide({ actors }) (startNode uses src/actors/nodeActors.ts)`);
}

/** Each actor's type; implementations come through .provide(). */
export const supervisorActors = {
  prepareNode: fromPromise<Prepared, PrepareInput>(() => notProvided('prepareNode')),
  groupSession: fromCallback<GroupCommand, GroupSessionInput, GroupEvent>(() => notProvided('groupSession')),
  rank: fromCallback<RankCommand, RankActorInput, RankEvent>(() => notProvided('rank')),
  rankService: fromCallback<ServeCommand, RankServiceInput, ServeEvent>(() => notProvided('rankService')),
  publishNodeManifest: fromCallback<PublishCommand, PublishNodeManifestInput>(() => notProvided('publishNodeManifest')),
  reportStartupFailure: fromPromise<boolean, ReportStartupFailureInput>(() => notProvided('reportStartupFailure')),
  /** Its own rank and serve actors are placeholders too (src/models/modelMachine.ts). */
  model: modelMachine,
};

const supervisorSetup = setup({
  types: {
    context: {} as SupervisorContext,
    events: {} as SupervisorEvent,
    input: {} as SupervisorInput,
    /** What startNode hears: a model to load again (its checkpoint files changed), through node.load's path. */
    emitted: {} as { type: 'MODEL_STALE'; spec: ModelSpec } | Extract<GroupEvent, { type: 'MODEL_GROUP_RELOAD' }>,
  },
  actors: supervisorActors,
  delays: { stopTimeout: STOP_TIMEOUT_MS },
  guards: {
    // Node 0 hosts the coordinator, which does not exist yet when it fails this early.
    hasGroupToTell: ({ context }) => context.config.nnodes > 1 && context.config.nodeRank !== 0,
    allRanksLoaded: ({ context }) => context.ranks.length > 0 && context.ranks.every((r) => r.state === 'loaded'),
    allRanksServing: ({ context }) => context.ranks.every((r) => r.state === 'serving' || r.state === 'released'),
    allRanksStopped: ({ context }) => context.ranks.every((r) => r.state === 'stopped') && context.models.length === 0,
    startupModelsServing: ({ context }) => context.models.every((m) => !m.startup || m.entries !== undefined),
    failsTheNode: ({ context, event }) => {
      assertEvent(event, 'MODEL_FAILED');
      return context.models.some((m) => m.id === event.id && m.startup && !m.restored);
    },
  },
  actions: {
    recordFailure: assign({
      failure: (_, params: { error: unknown }) => toFailure(params.error),
    }),
    recordGroupFailure: assign(({ context, event }) => {
      assertEvent(event, 'GROUP_FAILED');
      return { failure: context.failure ?? { ...event.error } };
    }),
    // Best effort: peers learn of a local failure at once instead of at their timeout.
    notifyGroupOfFailure: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'RANK_FAILED');
      if (!context.groupJoined) return;
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'NODE_FAILED', error: context.failure ?? event.error });
    }),
    joinGroup: enqueueActions(({ context, enqueue }) => {
      enqueue.spawnChild('groupSession', {
        id: GROUP_ACTOR_ID,
        input: { config: context.config, prepared: context.prepared!, log: context.log },
      });
      enqueue.assign({ groupJoined: true });
    }),
    // Every local rank digests the whole checkpoint: any one's digests are the node's.
    announceReady: enqueueActions(({ context, enqueue }) =>
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'NODE_READY', content: nodeContent(context.prepared!.plan, context.ranks[0]?.digests) })),
    recordGroupReady: assign({ groupReady: true }),
    recordFormation: assign({
      formation: ({ event }) => {
        assertEvent(event, 'GROUP_WAITING');
        return { joined: event.joined, missing: event.missing };
      },
    }),
    recordCoordinatorState: assign({
      coordinatorState: ({ event }) => {
        assertEvent(event, 'COORDINATOR_STATE');
        return event.state;
      },
    }),
    recordPeer: assign(({ context, event }) => {
      assertEvent(event, ['PEER_LOST', 'PEER_BACK']);
      const peer: PeerStatus =
        event.type === 'PEER_LOST'
          ? { nodeRank: event.nodeRank, state: 'lost', reason: event.reason, since: Date.now() }
          : { nodeRank: event.nodeRank, state: 'up', since: Date.now() };
      return { peers: [...context.peers.filter((p) => p.nodeRank !== event.nodeRank), peer] };
    }),
    recordRankFailure: assign(({ context, event }) => {
      assertEvent(event, 'RANK_FAILED');
      const rank = context.ranks.find((r) => r.localRank === event.localRank);
      return {
        ranks: updateRank(context.ranks, event.localRank, { state: 'failed' }),
        // The first failure is the cause; later ones are usually its consequences.
        failure: context.failure ?? {
          ...event.error,
          localRank: event.localRank,
          globalRank: rank?.globalRank,
          message: `rank ${rank?.globalRank ?? '?'} (local ${event.localRank}) failed: ${event.error.message}`,
        },
      };
    }),
    storePrepared: assign({
      prepared: (_, params: { prepared: Prepared }) => params.prepared,
    }),
    spawnStartupModels: enqueueActions(({ context, enqueue, self }) => {
      let n = context.modelsSpawned;
      const models = [...context.models];
      for (const planned of context.prepared!.models) {
        const id = modelActorId(n++);
        enqueue.spawnChild('model', { id, input: modelInput(context, self, id, planned, true) });
        models.push(modelEntry(id, planned, true));
      }
      enqueue.assign({ models, modelsSpawned: n });
    }),
    spawnModel: enqueueActions(({ context, event, enqueue, self }) => {
      assertEvent(event, 'MODEL_LOAD');
      const { planned, id } = event;
      enqueue.spawnChild('model', { id, input: modelInput(context, self, id, planned, false) });
      enqueue.assign({ models: [...context.models, modelEntry(id, planned, false)] });
      // Every node loads it as soon as it has joined; none serves it before node 0 commits.
      if (planned.placement.nnodes > 1) {
        const { name } = planned.spec;
        const { fingerprint, fingerprintFields } = planned.plan;
        enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_JOIN', name, fingerprint, fingerprintFields, tpSize: planned.spec.tpSize });
      }
    }),
    tellGroupPlanFailed: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'MODEL_PLAN_FAILED');
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_FAILED', name: event.name, error: event.error });
    }),
    tellGroupResident: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_RESIDENT');
      const m = context.models.find((x) => x.id === event.id);
      if (m?.group !== 'pending') return;
      context.log.info({ model: m.name, fingerprint: m.fingerprint }, `model "${m.name}" is resident here; waiting for node 0's commit`);
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_RESIDENT', name: m.name, fingerprint: m.fingerprint });
    }),
    // A reload across the group (src/models/groupReload.ts): this node's word to node 0, and node 0's to this node's reload.
    tellGroupStale: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'MODEL_GROUP_STALE');
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_STALE', name: event.name, fingerprint: event.fingerprint });
    }),
    vouchToGroup: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'MODEL_GROUP_VOUCH');
      const { name, fingerprint } = event.join;
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_JOIN', ...event.join });
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_RESIDENT', name, fingerprint });
    }),
    emitGroupReload: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'MODEL_GROUP_RELOAD');
      enqueue.emit(event);
    }),
    // A node that fails a swap across nodes fails it everywhere.
    tellGroupFailed: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_FAILED');
      const m = context.models.find((x) => x.id === event.id);
      if (m?.group === 'pending') enqueue.sendTo(GROUP_ACTOR_ID, { type: 'MODEL_GROUP_FAILED', name: m.name, fingerprint: m.fingerprint, error: event.error });
    }),
    // Node 0's verdict on a model that spans the group, to the model actor of that version.
    applyGroupVerdict: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, ['MODEL_GROUP_COMMIT', 'MODEL_GROUP_ABORT']);
      const m = context.models.find((x) => x.group === 'pending' && x.name === event.name && x.fingerprint === event.fingerprint);
      if (!m) {
        // A version this node only vouched for in a reload across the group (src/models/groupReload.ts): it loaded nothing.
        if (event.type === 'MODEL_GROUP_ABORT') context.log.error({ model: event.name, code: event.error.code }, `model "${event.name}" was not loaded again across the group: ${event.error.message}`);
        return;
      }
      if (event.type === 'MODEL_GROUP_COMMIT') {
        enqueue.sendTo(m.id, { type: 'MODEL_COMMIT' });
        enqueue.assign({ models: context.models.map((x) => (x === m ? { ...x, group: 'committed' as const } : x)) });
      } else {
        enqueue.sendTo(m.id, { type: 'MODEL_ABORT', error: event.error });
        // Its failure must not echo back to node 0 as this node's.
        enqueue.assign({ models: context.models.map((x) => (x === m ? { ...x, group: undefined } : x)) });
      }
    }),
    // A version serves: older versions of its name (the node's own model too) drain from now on.
    recordModelServing: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_SERVING');
      const serving = context.models.find((m) => m.id === event.id);
      if (!serving) return;
      const older = context.models.filter((m) => m.name === serving.name && m.id !== serving.id && !m.unloaded);
      for (const m of older) enqueue.sendTo(m.id, { type: 'MODEL_UNLOAD', force: false });
      const drainOwn = serving.name === context.config.models[0].name && !context.ownDrained;
      if (drainOwn) for (const r of context.ranks) enqueue.sendTo(serveActorId(r.localRank), { type: 'SERVE_DRAIN', force: false });
      enqueue.assign({
        ownDrained: context.ownDrained || drainOwn,
        models: context.models.map((m) => (m.id === serving.id ? { ...m, entries: event.entries } : older.includes(m) ? { ...m, unloaded: true } : m)),
      });
    }),
    // The own model's files changed: no new lease (its servers refuse E_STALE already), drained,
    // no longer kept, and loaded again as a new version of its name (the hot swap's path).
    recordOwnStale: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'RANK_STALE');
      // Drained already (unloaded, or a newer version serves): not to be loaded again.
      if (context.ownStale || context.ownDrained) return;
      const { name } = context.config.models[0];
      context.log.warn({ model: name, files: event.changes }, staleMessage(name, event.described));
      for (const r of context.ranks) {
        enqueue.sendTo(serveActorId(r.localRank), { type: 'SERVE_DRAIN', force: false });
        if (r.state !== 'released') enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_UNKEEP' });
      }
      enqueue.assign({ ownStale: { changes: event.changes, described: event.described, since: Date.now() }, ownDrained: true });
      enqueue.emit({ type: 'MODEL_STALE', spec: context.config.models[0]! });
    }),
    // Another model's files changed: it drains itself (src/models/modelMachine.ts) and is loaded again.
    recordModelStale: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_STALE');
      context.log.warn({ model: event.spec.name, files: event.changes }, staleMessage(event.spec.name, event.described));
      enqueue.assign({ models: context.models.map((m) => (m.id === event.id ? { ...m, unloaded: true } : m)) });
      enqueue.emit({ type: 'MODEL_STALE', spec: event.spec });
    }),
    unloadModels: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_UNLOAD');
      for (const id of event.ids) enqueue.sendTo(id, { type: 'MODEL_UNLOAD', force: event.force });
      if (event.own) for (const r of context.ranks) enqueue.sendTo(serveActorId(r.localRank), { type: 'SERVE_DRAIN', force: event.force });
      enqueue.assign({
        ownDrained: context.ownDrained || event.own,
        models: context.models.map((m) => (event.ids.includes(m.id) ? { ...m, unloaded: true } : m)),
      });
    }),
    // A model that failed after the node was ready is gone alone; the others keep serving.
    dropModel: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, ['MODEL_GONE', 'MODEL_FAILED']);
      if (event.type === 'MODEL_FAILED') context.log.error({ code: event.error.code, model: context.models.find((m) => m.id === event.id)?.name }, event.error.message);
      enqueue.stopChild(event.id);
      enqueue.assign({ models: context.models.filter((m) => m.id !== event.id) });
    }),
    recordModelFailure: assign(({ context, event }) => {
      assertEvent(event, 'MODEL_FAILED');
      return { failure: context.failure ?? event.error };
    }),
    republishManifest: enqueueActions(({ context, enqueue }) => enqueue.sendTo('publishManifest', { type: 'REPUBLISH', manifest: manifestOf(context) })),
    // Ranks exist from loading on (context.ranks is filled as they are spawned); a rank not loaded yet keeps its segments once it is.
    keepAgain: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_KEEP_AGAIN' });
      for (const m of context.models) enqueue.sendTo(m.id, { type: 'KEEPER_BACK' });
    }),
    stopModels: enqueueActions(({ context, enqueue }) => {
      for (const m of context.models) enqueue.sendTo(m.id, { type: 'MODEL_STOP' });
    }),
    storeRankTable: assign(({ context, event }) => {
      assertEvent(event, 'GROUP_JOINED');
      return {
        rankTable: event.rankTable,
        ranks: event.rankTable
          .filter((e) => e.nodeRank === context.config.nodeRank)
          .map((e) => ({
            localRank: e.localRank,
            globalRank: e.globalRank,
            state: 'starting' as const,
            bytes: 0,
            totalBytes: context.prepared?.plan.ranks[e.globalRank]?.totalBytes ?? 0,
            seconds: 0,
          })),
      };
    }),
    spawnRanks: enqueueActions(({ context, enqueue }) => {
      const own = ownRanks(context);
      const host = { rankWorker: context.rankWorker, workers: context.workers, cudaHandles: context.config.cudaHandles };
      for (const r of context.ranks) {
        enqueue.spawnChild('rank', { id: rankActorId(r.localRank), input: rankActorInput(own, r, host, rankLog(context, r), { keeper: context.prepared!.keeper }) });
      }
    }),
    // A rank's socket is bound only once its weights are resident, so a client never maps a
    // half-filled arena; until then clients fall back to disk.
    spawnServers: enqueueActions(({ context, enqueue }) => {
      const own = ownRanks(context);
      const serve = { socketDir: context.prepared!.socketDir, servers: context.servers, version: OWN_VERSION, own: true };
      for (const r of context.ranks) enqueue.spawnChild('rankService', { id: serveActorId(r.localRank), input: rankServiceInput(own, r, serve, rankLog(context, r)) });
    }),
    // Servers go first so no client attaches to memory that is about to be freed.
    stopRanks: enqueueActions(({ context, enqueue }) => {
      for (const r of context.ranks) {
        enqueue.stopChild(serveActorId(r.localRank));
        enqueue.sendTo(rankActorId(r.localRank), { type: 'RANK_STOP' });
      }
    }),
    recordServing: assign(({ context, event }) => {
      assertEvent(event, 'RANK_SERVING');
      return { ranks: updateRank(context.ranks, event.localRank, { state: 'serving', socketPath: event.socketPath }) };
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
    // What a rank's reports change in its row (models/rankUpdates.ts, shared with the other machine that owns ranks).
    recordDevice: assign(({ context, event }) => (assertEvent(event, 'RANK_DEVICE'), { ranks: recordReport(context.ranks, event) })),
    recordProgress: assign(({ context, event }) => (assertEvent(event, 'RANK_PROGRESS'), { ranks: recordReport(context.ranks, event) })),
    recordLoaded: assign(({ context, event }) => (assertEvent(event, 'RANK_LOADED'), { ranks: recordReport(context.ranks, event) })),
    recordKept: assign(({ context, event }) => (assertEvent(event, 'RANK_KEPT'), { ranks: recordReport(context.ranks, event) })),
    recordStopped: assign(({ context, event }) => {
      assertEvent(event, 'RANK_STOPPED');
      return { ranks: updateRank(context.ranks, event.localRank, { state: 'stopped' }) };
    }),
    recordStopTimeout: assign(({ context }) => ({
      failure: {
        name: 'RankFailedError',
        code: 'E_STOP_TIMEOUT',
        message: `ranks ${context.ranks.filter((r) => r.state !== 'stopped').map((r) => r.globalRank).join(', ')} did not stop within ${STOP_TIMEOUT_MS / 1000} s; their threads were terminated`,
      },
    })),
  },
})

/** Any rank's failure, in any state where ranks exist, tears the whole node down. */
const rankFailed = { target: '#supervisor.failed', actions: ['recordRankFailure', 'notifyGroupOfFailure'] } as const;

/** A client's allowed release frees its rank through the worker, then answers the server. */
const clientRelease = {
  RANK_RELEASE_REQUESTED: { actions: 'releaseRank' },
  RANK_RELEASED: { actions: 'recordReleased' },
} as const;

/**
 * Before the node is ready, the models it starts with load beside its own; the failure of one on
 * its command line fails the node, that of one restored from the keeper fails that model alone.
 */
const startupModels = {
  MODEL_SERVING: { actions: 'recordModelServing' },
  MODEL_FAILED: [{ guard: 'failsTheNode', target: '#supervisor.failed', actions: 'recordModelFailure' }, { actions: 'dropModel' }],
  MODEL_GONE: { actions: 'dropModel' },
  MODEL_STALE: { actions: 'recordModelStale' },
} as const;

export const supervisorMachine = supervisorSetup.createMachine({
  id: 'supervisor',
  initial: 'init',
  context: ({ input }) => ({ ...input, rankTable: [], ranks: [], groupJoined: false, groupReady: false, peers: [], models: [], ownDrained: false, modelsSpawned: 0 }),
  states: {
    init: {
      invoke: {
        id: 'prepare',
        src: 'prepareNode',
        input: ({ context }) => ({ config: context.config, log: context.log, keeper: context.keeper, servers: context.servers }),
        onDone: { target: 'rendezvous', actions: { type: 'storePrepared', params: ({ event }) => ({ prepared: event.output }) } },
        onError: [
          { guard: 'hasGroupToTell', target: 'reportingFailure', actions: { type: 'recordFailure', params: ({ event }) => ({ error: event.error }) } },
          { target: 'failed', actions: { type: 'recordFailure', params: ({ event }) => ({ error: event.error }) } },
        ],
      },
      on: { STOP: 'stopped' },
    },
    // Failed before joining: node 0 hears it, so the others do not wait for their timeout.
    reportingFailure: {
      invoke: {
        id: 'reportFailure',
        src: 'reportStartupFailure',
        input: ({ context }) => ({ config: context.config, failure: context.failure!, log: context.log }),
        onDone: 'failed',
        onError: 'failed',
      },
      on: { STOP: 'failed' },
    },
    rendezvous: {
      // The group session outlives this state: it keeps heartbeats and the ready barrier.
      entry: 'joinGroup',
      on: {
        GROUP_JOINED: { target: 'loading', actions: 'storeRankTable' },
        GROUP_WAITING: { actions: 'recordFormation' },
        STOP: 'stopped',
      },
    },
    loading: {
      entry: ['spawnRanks', 'spawnStartupModels'],
      on: {
        ...startupModels,
        RANK_DEVICE: { actions: 'recordDevice' },
        RANK_PROGRESS: { actions: 'recordProgress' },
        RANK_LOADED: { actions: 'recordLoaded' },
        RANK_FAILED: rankFailed,
        STOP: 'stopping',
      },
      always: { guard: 'allRanksLoaded', target: 'starting' },
    },
    // Each rank's socket is bound (the model machine's "starting"); the node serves once ready.
    starting: {
      entry: 'spawnServers',
      on: {
        RANK_SERVING: { actions: 'recordServing' },
        RANK_STALE: { actions: 'recordOwnStale' },
        // A rank's socket is live before its siblings' are, so a client may already release.
        ...clientRelease,
        ...startupModels,
        RANK_FAILED: rankFailed,
        STOP: 'stopping',
      },
      always: { guard: and(['allRanksServing', 'startupModelsServing']), target: 'ready' },
    },
    ready: {
      entry: 'announceReady',
      invoke: {
        id: 'publishManifest',
        src: 'publishNodeManifest',
        input: ({ context }) => ({ socketDir: context.prepared!.socketDir, log: context.log, manifest: manifestOf(context) }),
      },
      on: {
        ...clientRelease,
        MODEL_LOAD: { actions: 'spawnModel' },
        MODEL_SERVING: { actions: ['recordModelServing', 'republishManifest'] },
        RANK_STALE: { actions: ['recordOwnStale', 'republishManifest'] },
        MODEL_STALE: { actions: ['recordModelStale', 'republishManifest'] },
        MODEL_UNLOAD: { actions: ['unloadModels', 'republishManifest'] },
        MODEL_GONE: { actions: ['dropModel', 'republishManifest'] },
        MODEL_FAILED: { actions: ['tellGroupFailed', 'dropModel', 'republishManifest'] },
        MODEL_RESIDENT: { actions: 'tellGroupResident' },
        MODEL_PLAN_FAILED: { actions: 'tellGroupPlanFailed' },
        MODEL_GROUP_COMMIT: { actions: 'applyGroupVerdict' },
        MODEL_GROUP_ABORT: { actions: 'applyGroupVerdict' },
        MODEL_GROUP_STALE: { actions: 'tellGroupStale' },
        MODEL_GROUP_VOUCH: { actions: 'vouchToGroup' },
        MODEL_GROUP_RELOAD: { actions: 'emitGroupReload' },
        GROUP_READY: { actions: 'recordGroupReady' },
        PEER_LOST: { actions: 'recordPeer' },
        PEER_BACK: { actions: 'recordPeer' },
        RANK_FAILED: rankFailed,
        STOP: 'stopping',
      },
    },
    stopping: {
      entry: ['stopRanks', 'stopModels'],
      on: { RANK_STOPPED: { actions: 'recordStopped' }, RANK_FAILED: rankFailed, MODEL_GONE: { actions: 'dropModel' }, MODEL_FAILED: { actions: 'dropModel' } },
      always: { guard: 'allRanksStopped', target: 'stopped' },
      after: { stopTimeout: { target: 'failed', actions: 'recordStopTimeout' } },
    },
    stopped: { type: 'final' },
    failed: { type: 'final' },
  },
  on: {
    GROUP_FAILED: { target: '.failed', actions: 'recordGroupFailure' },
    COORDINATOR_STATE: { actions: 'recordCoordinatorState' },
    // A keeper takes, loses or drops a rank's segments in any state a rank lives in.
    RANK_KEPT: { actions: 'recordKept' },
    KEEPER_BACK: { actions: 'keepAgain' },
  },
});

// The status's NodeState names exactly these states.
true satisfies SameStateNames<StateValueFrom<typeof supervisorMachine>, NodeState>;

/** The node's own model's ranks, as prepared and placed on the whole group. */
function ownRanks(context: SupervisorContext): ModelRanks {
  const { plan, devices, fill } = context.prepared!;
  return { name: context.config.models[0].name, plan, devices, fill, nodeRank: context.config.nodeRank, nnodes: context.config.nnodes };
}

function modelInput(context: SupervisorContext, parent: AnyActorRef, id: string, planned: PlannedModel, startup: boolean): ModelInput {
  return {
    id,
    parent,
    planned,
    startup,
    socketDir: context.prepared!.socketDir,
    cudaHandles: context.config.cudaHandles,
    keeper: context.prepared!.keeper && { ...context.prepared!.keeper, model: planned.spec.modelDir, load: (planned.origin ?? 'start') === 'start' ? undefined : keptLoadOf(planned.spec, planned.plan.fingerprint) },
    log: context.log.child({ model: planned.spec.name }),
    rankWorker: context.rankWorker,
    workers: context.workers,
    servers: context.servers,
  };
}

function modelEntry(id: string, planned: PlannedModel, startup: boolean): ModelEntry {
  return {
    id,
    name: planned.spec.name,
    fingerprint: planned.plan.fingerprint,
    tpSize: planned.spec.tpSize,
    startup,
    restored: planned.origin === 'restore',
    unloaded: false,
    ...(planned.placement.nnodes > 1 ? { group: 'pending' as const } : {}),
  };
}

/** node.json: the node's own model's ranks (as before several models) and every model that serves. */
function manifestOf(context: SupervisorContext): PublishNodeManifestInput['manifest'] {
  const plan = context.prepared!.plan;
  const own: NodeManifestEntry[] = context.ranks
    .filter((r) => r.state === 'serving')
    .map((r) => ({ globalRank: r.globalRank, localRank: r.localRank, socketPath: r.socketPath!, deviceUuid: r.device!.uuid, fingerprint: plan.ranks[r.globalRank]!.fingerprint }));
  const models: NodeManifestModel[] = [
    ...(own.length > 0 ? [{ name: context.config.models[0].name, fingerprint: plan.fingerprint, tpSize: context.config.tpSize, draining: context.ownDrained, ranks: own }] : []),
    ...context.models.filter((m) => m.entries).map((m) => ({ name: m.name, fingerprint: m.fingerprint, tpSize: m.tpSize, draining: m.unloaded, ranks: m.entries! })),
  ];
  return {
    entries: own,
    models,
    group: { nodeRank: context.config.nodeRank, nnodes: context.config.nnodes, tpSize: context.config.tpSize, rankTable: context.rankTable },
  };
}

/** The log line of a model found stale, naming each file and how it changed. */
function staleMessage(name: string, described: string): string {
  return `model "${name}" is stale: its checkpoint files changed since it was loaded (${described}); it takes no new lease from now on (clients load from disk), its leases keep their memory until they end, and it is loaded again`;
}

function toFailure(err: unknown): NodeFailure {
  const e = err as Partial<SerializedError> & Error;
  return { name: e?.name ?? 'Error', code: e?.code ?? 'E_INTERNAL', message: e?.message ?? String(err), details: e?.details, stack: e?.stack };
}
