// The node's lifecycle as a state machine. It holds no I/O: setup() declares each actor as a
// typed placeholder, and the composition root (startNode, with src/actors/nodeActors.ts) or a
// test supplies the implementations through .provide(). Importing the machine therefore loads
// no addon, so the CLI can draw the chart on a machine where the addon is not built.
import { assertEvent, assign, enqueueActions, fromCallback, fromPromise, setup, type AnyActorRef, type StateValueFrom } from 'xstate';
import type { PlannedModel } from '../models/planModel.js';
import type { GroupSessionInput, PrepareInput, Prepared, PublishCommand, PublishNodeManifestInput, ReportStartupFailureInput } from './supervisorActors.js';
import { nodeContent } from '../rendezvous/nodeContent.js';
import type { ServerRegistry } from '../serve/serverRegistry.js';
import type { WorkerRegistry } from '../models/workerRegistry.js';
import { WeightdError, type SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import type { NodeConfig } from '../nodeOptions.js';
import type { GroupFormation, NodeFailure, NodeState, PeerStatus, SameStateNames } from '../nodeStatus.js';
import type { GroupCommand, GroupEvent } from '../rendezvous/groupEvents.js';
import type { RankTableEntry } from '../wire/rankTable.js';
import type { SupervisorEvent } from './events.js';
import { modelActorId, modelFailureMessage, type ModelEntry } from '../models/modelHost.js';
import { FORMS_GROUP, LOADED_BESIDE, modelMachine, type ModelInput } from '../models/modelMachine.js';
import type { NodeManifestModel } from '../wire/nodeManifest.js';
import { keptLoadOf } from '../models/keptLoad.js';
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
  /** The model versions the node serves, oldest first, the node's first model first (src/models/modelMachine.ts). */
  models: ModelEntry[];
  rankTable: RankTableEntry[];
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

/** How long ranks get to free their devices after STOP before the node gives up on them. */
export const STOP_TIMEOUT_MS = 30_000;

/** A placeholder's body: running the machine without providing that actor is a wiring bug. */
function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the supervisor's "${name}" actor was not provided; create the machine with .provide({ actors }) (startNode uses src/actors/nodeActors.ts)`);
}

/** Each actor's type; implementations come through .provide(). */
export const supervisorActors = {
  prepareNode: fromPromise<Prepared, PrepareInput>(() => notProvided('prepareNode')),
  groupSession: fromCallback<GroupCommand, GroupSessionInput, GroupEvent>(() => notProvided('groupSession')),
  publishNodeManifest: fromCallback<PublishCommand, PublishNodeManifestInput>(() => notProvided('publishNodeManifest')),
  reportStartupFailure: fromPromise<boolean, ReportStartupFailureInput>(() => notProvided('reportStartupFailure')),
  /** Every model the node serves, its first included; its rank and serve actors are placeholders too (src/models/modelMachine.ts). */
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
    allModelsGone: ({ context }) => context.models.every((m) => m.gone),
    startupModelsServing: ({ context }) => context.models.every((m) => !m.startup || m.entries !== undefined),
    formsGroup: ({ context, event }) => {
      assertEvent(event, ['MODEL_STARTING', 'MODEL_FAILED']);
      return context.models.some((m) => m.id === event.id && m.formsGroup);
    },
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
      assertEvent(event, 'MODEL_FAILED');
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
    // The group compares the content of the model it formed around, as its model actor digested it.
    announceReady: enqueueActions(({ context, enqueue }) =>
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'NODE_READY', content: nodeContent(context.prepared!.models[0]!.plan, context.models.find((m) => m.formsGroup)?.digests) })),
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
    storePrepared: assign({
      prepared: (_, params: { prepared: Prepared }) => params.prepared,
    }),
    // The node's first model, placed by the rendezvous, joins as FORMS_GROUP; the others load beside it.
    spawnStartupModels: enqueueActions(({ context, enqueue, self }) => {
      const models = context.prepared!.models.map((planned, n) => {
        const id = modelActorId(n);
        enqueue.spawnChild('model', { id, input: modelInput(context, self, id, planned, true, n === 0) });
        return modelEntry(id, planned, true, n === 0);
      });
      enqueue.assign({ models: [...context.models, ...models] });
    }),
    spawnModel: enqueueActions(({ context, event, enqueue, self }) => {
      assertEvent(event, 'MODEL_LOAD');
      const { planned, id } = event;
      enqueue.spawnChild('model', { id, input: modelInput(context, self, id, planned, false, false) });
      enqueue.assign({ models: [...context.models, modelEntry(id, planned, false, false)] });
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
    // A version serves: older versions of its name (the node's first model's too) drain from now on.
    recordModelServing: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_SERVING');
      const serving = context.models.find((m) => m.id === event.id);
      if (!serving) return;
      // After a writer's commit the model control keeps the retained ones (--keep-versions) and unloads the rest.
      const older = serving.retainsOlder ? [] : context.models.filter((m) => m.name === serving.name && m.id !== serving.id && !m.unloaded);
      for (const m of older) enqueue.sendTo(m.id, { type: 'MODEL_UNLOAD', force: false });
      enqueue.assign({
        models: context.models.map((m) => (m.id === serving.id ? { ...m, entries: event.entries, digests: event.digests } : older.includes(m) ? { ...m, unloaded: true } : m)),
      });
    }),
    // A model's files changed: it drains itself (src/models/modelMachine.ts) and is loaded again.
    recordModelStale: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_STALE');
      context.log.warn({ model: event.spec.name, files: event.changes }, staleMessage(event.spec.name, event.described));
      enqueue.assign({ models: context.models.map((m) => (m.id === event.id ? { ...m, unloaded: true } : m)) });
      enqueue.emit({ type: 'MODEL_STALE', spec: event.spec });
    }),
    unloadModels: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_UNLOAD');
      for (const id of event.ids) enqueue.sendTo(id, { type: 'MODEL_UNLOAD', force: event.force });
      enqueue.assign({
        models: context.models.map((m) => (event.ids.includes(m.id) ? { ...m, unloaded: true } : m)),
      });
    }),
    // A model that failed after the node was ready is gone alone; the others keep serving. The
    // node's first model stays listed once released, as it always was: its actor is kept, done.
    dropModel: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, ['MODEL_GONE', 'MODEL_FAILED']);
      const m = context.models.find((x) => x.id === event.id);
      if (event.type === 'MODEL_FAILED') context.log.error({ code: event.error.code, model: m?.name }, m ? modelFailureMessage(m.name, event.error) : event.error.message);
      if (event.type === 'MODEL_GONE' && m?.formsGroup) {
        enqueue.assign({ models: context.models.map((x) => (x === m ? { ...x, gone: true, unloaded: true } : x)) });
        return;
      }
      enqueue.stopChild(event.id);
      enqueue.assign({ models: context.models.filter((x) => x.id !== event.id) });
    }),
    recordModelFailure: assign(({ context, event }) => {
      assertEvent(event, 'MODEL_FAILED');
      return { failure: context.failure ?? event.error };
    }),
    republishManifest: enqueueActions(({ context, enqueue }) => enqueue.sendTo('publishManifest', { type: 'REPUBLISH', manifest: manifestOf(context) })),
    // Each model passes it to its ranks; a rank not loaded yet keeps its segments once it is.
    keepAgain: enqueueActions(({ context, enqueue }) => {
      for (const m of context.models) if (!m.gone) enqueue.sendTo(m.id, { type: 'KEEPER_BACK' });
    }),
    stopModels: enqueueActions(({ context, enqueue }) => {
      for (const m of context.models) if (!m.gone) enqueue.sendTo(m.id, { type: 'MODEL_STOP' });
    }),
    storeRankTable: assign(({ event }) => {
      assertEvent(event, 'GROUP_JOINED');
      return { rankTable: event.rankTable };
    }),
    recordStopTimeout: assign(({ context }) => ({
      failure: {
        name: 'RankFailedError',
        code: 'E_STOP_TIMEOUT',
        message: `the ranks of models ${context.models.filter((m) => !m.gone).map((m) => `"${m.name}"`).join(', ')} did not stop within ${STOP_TIMEOUT_MS / 1000} s; their threads were terminated`,
      },
    })),
  },
})

/** A model's failure that fails the node: peers hear it at once. */
const nodeFailed = { target: '#supervisor.failed', actions: ['recordModelFailure', 'notifyGroupOfFailure'] } as const;

/**
 * Before the node is ready, the models it starts with load; the failure of one on its command
 * line fails the node, that of one restored from the keeper fails that model alone.
 */
const startupModels = {
  MODEL_SERVING: { actions: 'recordModelServing' },
  MODEL_FAILED: [{ guard: 'failsTheNode', ...nodeFailed }, { actions: 'dropModel' }],
  MODEL_GONE: { actions: 'dropModel' },
  MODEL_STALE: { actions: 'recordModelStale' },
} as const;

export const supervisorMachine = supervisorSetup.createMachine({
  id: 'supervisor',
  initial: 'init',
  context: ({ input }) => ({ ...input, rankTable: [], groupJoined: false, groupReady: false, peers: [], models: [] }),
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
    // The models the node starts with load, each a model actor; the first is the group's.
    loading: {
      entry: 'spawnStartupModels',
      on: {
        ...startupModels,
        MODEL_STARTING: { guard: 'formsGroup', target: 'starting' },
        STOP: 'stopping',
      },
    },
    // The group's model binds its sockets (its model machine's "starting"); the node is ready once every startup model serves.
    starting: {
      on: { ...startupModels, STOP: 'stopping' },
      always: { guard: 'startupModelsServing', target: 'ready' },
    },
    ready: {
      entry: 'announceReady',
      invoke: {
        id: 'publishManifest',
        src: 'publishNodeManifest',
        input: ({ context }) => ({ socketDir: context.prepared!.socketDir, log: context.log, manifest: manifestOf(context) }),
      },
      on: {
        MODEL_LOAD: { actions: 'spawnModel' },
        MODEL_SERVING: { actions: ['recordModelServing', 'republishManifest'] },
        MODEL_STALE: { actions: ['recordModelStale', 'republishManifest'] },
        MODEL_UNLOAD: { actions: ['unloadModels', 'republishManifest'] },
        MODEL_GONE: { actions: ['dropModel', 'republishManifest'] },
        // The group's model fails the node in any state; any other is gone alone.
        MODEL_FAILED: [{ guard: 'formsGroup', ...nodeFailed }, { actions: ['tellGroupFailed', 'dropModel', 'republishManifest'] }],
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
        STOP: 'stopping',
      },
    },
    stopping: {
      entry: 'stopModels',
      on: { MODEL_GONE: { actions: 'dropModel' }, MODEL_FAILED: { actions: 'dropModel' } },
      always: { guard: 'allModelsGone', target: 'stopped' },
      after: { stopTimeout: { target: 'failed', actions: 'recordStopTimeout' } },
    },
    stopped: { type: 'final' },
    failed: { type: 'final' },
  },
  on: {
    GROUP_FAILED: { target: '.failed', actions: 'recordGroupFailure' },
    COORDINATOR_STATE: { actions: 'recordCoordinatorState' },
    KEEPER_BACK: { actions: 'keepAgain' },
  },
});

// The status's NodeState names exactly these states.
true satisfies SameStateNames<StateValueFrom<typeof supervisorMachine>, NodeState>;

function modelInput(context: SupervisorContext, parent: AnyActorRef, id: string, planned: PlannedModel, startup: boolean, formsGroup: boolean): ModelInput {
  return {
    id,
    parent,
    planned,
    startup,
    join: formsGroup ? FORMS_GROUP : LOADED_BESIDE,
    socketDir: context.prepared!.socketDir,
    cudaHandles: context.config.cudaHandles,
    // A written version is not kept: a restart would restore it from its checkpoint's files (docs/weight-updates.md).
    keeper: planned.origin === 'update' ? undefined : context.prepared!.keeper && { ...context.prepared!.keeper, model: planned.spec.modelDir, load: (planned.origin ?? 'start') === 'start' ? undefined : keptLoadOf(planned.spec, planned.plan.fingerprint) },
    log: context.log.child({ model: planned.spec.name }),
    rankWorker: context.rankWorker,
    workers: context.workers,
    servers: context.servers,
  };
}

function modelEntry(id: string, planned: PlannedModel, startup: boolean, formsGroup: boolean): ModelEntry {
  return {
    id,
    name: planned.spec.name,
    fingerprint: planned.plan.fingerprint,
    tpSize: planned.spec.tpSize,
    startup,
    restored: planned.origin === 'restore',
    formsGroup,
    unloaded: false,
    ...(planned.origin === 'update' ? { retainsOlder: true } : {}),
    // The group formed around the first model at rendezvous: no commit round for it.
    ...(planned.placement.nnodes > 1 && !formsGroup ? { group: 'pending' as const } : {}),
  };
}

/**
 * node.json: every model that serves or drains, and as `entries` (what a client that names no
 * model reads, as before several models) the ranks of the newest version of the node's first
 * model's name that serves, else of one that drains.
 */
function manifestOf(context: SupervisorContext): PublishNodeManifestInput['manifest'] {
  const listed = context.models.filter((m) => m.entries && !m.gone);
  const models: NodeManifestModel[] = listed.map((m) => ({ name: m.name, fingerprint: m.fingerprint, tpSize: m.tpSize, draining: m.unloaded, ranks: m.entries! }));
  const first = listed.filter((m) => m.name === context.config.models[0].name);
  return {
    entries: (first.findLast((m) => !m.unloaded) ?? first.at(-1))?.entries ?? [],
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
