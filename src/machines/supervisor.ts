// The node's lifecycle as a state machine. It holds no I/O: setup() declares each actor as a
// typed placeholder, and the composition root (startNode, with src/actors/nodeActors.ts) or a
// test supplies the implementations through .provide(). Importing the machine therefore loads
// no addon, so the CLI can draw the chart on a machine where the addon is not built.
import { assertEvent, assign, enqueueActions, fromCallback, fromPromise, sendTo, setup, type StateValueFrom } from 'xstate';
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
import { MODEL_REGISTRY_ID, type ModelListing } from '../models/modelHost.js';
import { modelRegistryMachine } from '../models/modelRegistryMachine.js';
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
  rankTable: RankTableEntry[];
  failure?: NodeFailure;
  /** Every node of the group has reported ready (always true soon after ready on one node). */
  groupReady: boolean;
  /** The group session actor exists (from rendezvous on). */
  groupJoined: boolean;
  /** The model registry actor exists (from loading on). */
  modelsSpawned: boolean;
  /** Other nodes seen lost or back while serving. */
  peers: PeerStatus[];
  /** During rendezvous, once node 0 answered: who has joined and who is still missing. */
  formation?: GroupFormation;
  /** On node 0: the rendezvous coordinator's state. */
  coordinatorState?: string;
}

export const GROUP_ACTOR_ID = 'group';

/** How long ranks get to free their devices after STOP before the node gives up on them (the model registry's bound). */
export { STOP_TIMEOUT_MS } from '../models/modelRegistryMachine.js';

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
  /** The models the node serves, from "loading" on; each model actor, and its rank and serve actors, are placeholders too (src/models/modelRegistryMachine.ts). */
  modelRegistry: modelRegistryMachine,
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
  guards: {
    // Node 0 hosts the coordinator, which does not exist yet when it fails this early.
    hasGroupToTell: ({ context }) => context.config.nnodes > 1 && context.config.nodeRank !== 0,
  },
  actions: {
    recordFailure: assign({
      failure: (_, params: { error: unknown }) => toFailure(params.error),
    }),
    recordStopTimeout: assign(({ event }) => {
      assertEvent(event, 'MODELS_STOP_TIMED_OUT');
      return { failure: event.failure };
    }),
    recordGroupFailure: assign(({ context, event }) => {
      assertEvent(event, 'GROUP_FAILED');
      return { failure: context.failure ?? { ...event.error } };
    }),
    // Best effort: peers learn of a local failure at once instead of at their timeout.
    notifyGroupOfFailure: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_FAILS_NODE');
      if (!context.groupJoined) return;
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'NODE_FAILED', error: context.failure ?? event.failure });
    }),
    joinGroup: enqueueActions(({ context, enqueue }) => {
      enqueue.spawnChild('groupSession', {
        id: GROUP_ACTOR_ID,
        input: { config: context.config, prepared: context.prepared!, log: context.log },
      });
      enqueue.assign({ groupJoined: true });
    }),
    // The group compares the content of the model it formed around, as its model actor digested it.
    announceReady: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'STARTUP_MODELS_SERVING');
      enqueue.sendTo(GROUP_ACTOR_ID, { type: 'NODE_READY', content: nodeContent(context.prepared!.models[0]!.plan, event.digests) });
    }),
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
    // The models load once the group is joined; the registry outlives "loading" until the node stops.
    spawnModelRegistry: enqueueActions(({ context, enqueue, self }) => {
      const { prepared, config } = context;
      enqueue.spawnChild('modelRegistry', {
        id: MODEL_REGISTRY_ID,
        input: { node: self, startup: prepared!.models, socketDir: prepared!.socketDir, cudaHandles: config.cudaHandles, keeper: prepared!.keeper, log: context.log, rankWorker: context.rankWorker, workers: context.workers, servers: context.servers },
      });
      enqueue.assign({ modelsSpawned: true });
    }),
    // node.load, node.unload, and the group's verdicts on a model that spans it.
    forwardToModels: sendTo(MODEL_REGISTRY_ID, ({ event }) => event as never),
    stopModels: sendTo(MODEL_REGISTRY_ID, { type: 'MODELS_STOP' }),
    // The group failed: the models end with the node, their last snapshots kept for its status.
    haltModels: enqueueActions(({ context, enqueue }) => {
      if (context.modelsSpawned) enqueue.sendTo(MODEL_REGISTRY_ID, { type: 'MODELS_HALT' });
    }),
    // The keeper is back: before the models exist there is nobody to tell.
    keepAgain: enqueueActions(({ context, enqueue }) => {
      if (context.modelsSpawned) enqueue.sendTo(MODEL_REGISTRY_ID, { type: 'KEEPER_BACK' });
    }),
    tellGroup: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'TELL_GROUP');
      enqueue.sendTo(GROUP_ACTOR_ID, event.command);
    }),
    // A reload across the group (src/models/groupReload.ts): node 0's word to this node's reload.
    emitGroupReload: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'MODEL_GROUP_RELOAD');
      enqueue.emit(event);
    }),
    // A model whose files changed drains (src/models/modelRegistryMachine.ts); startNode loads it again.
    emitModelStale: enqueueActions(({ event, enqueue }) => {
      assertEvent(event, 'MODEL_RELOAD');
      enqueue.emit({ type: 'MODEL_STALE', spec: event.spec });
    }),
    recordModelFailure: assign(({ context, event }) => {
      assertEvent(event, 'MODEL_FAILS_NODE');
      return { failure: context.failure ?? event.failure };
    }),
    republishManifest: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODELS_LISTED');
      enqueue.sendTo('publishManifest', { type: 'REPUBLISH', manifest: manifestOf(context, event.listing) });
    }),
    storeRankTable: assign(({ event }) => {
      assertEvent(event, 'GROUP_JOINED');
      return { rankTable: event.rankTable };
    }),
  },
})

/**
 * What the model registry reports while the node loads or serves: a model whose failure fails the
 * node (one it started with, the group's in any state; src/models/modelRegistryMachine.ts) fails it,
 * and peers hear it at once.
 */
const withModels = {
  MODEL_FAILS_NODE: { target: '#supervisor.failed', actions: ['recordModelFailure', 'notifyGroupOfFailure'] },
  STOP: 'stopping',
} as const;

export const supervisorMachine = supervisorSetup.createMachine({
  id: 'supervisor',
  initial: 'init',
  context: ({ input }) => ({ ...input, rankTable: [], groupJoined: false, modelsSpawned: false, groupReady: false, peers: [] }),
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
    // The models the node starts with load, each a model actor of the registry; the first is the group's.
    loading: {
      entry: 'spawnModelRegistry',
      on: { ...withModels, GROUP_MODEL_STARTING: 'starting' },
    },
    // The group's model binds its sockets (its model machine's "starting"); the node is ready once every startup model serves.
    starting: {
      on: { ...withModels, STARTUP_MODELS_SERVING: 'ready' },
    },
    ready: {
      entry: 'announceReady',
      invoke: {
        id: 'publishManifest',
        src: 'publishNodeManifest',
        input: ({ context, event }) => {
          assertEvent(event, 'STARTUP_MODELS_SERVING');
          return { socketDir: context.prepared!.socketDir, log: context.log, manifest: manifestOf(context, event.listing) };
        },
      },
      on: {
        ...withModels,
        MODEL_LOAD: { actions: 'forwardToModels' },
        MODEL_UNLOAD: { actions: 'forwardToModels' },
        MODEL_PLAN_FAILED: { actions: 'forwardToModels' },
        MODEL_GROUP_STALE: { actions: 'forwardToModels' },
        MODEL_GROUP_VOUCH: { actions: 'forwardToModels' },
        MODEL_GROUP_COMMIT: { actions: 'forwardToModels' },
        MODEL_GROUP_ABORT: { actions: 'forwardToModels' },
        MODELS_LISTED: { actions: 'republishManifest' },
        MODEL_GROUP_RELOAD: { actions: 'emitGroupReload' },
        GROUP_READY: { actions: 'recordGroupReady' },
        PEER_LOST: { actions: 'recordPeer' },
        PEER_BACK: { actions: 'recordPeer' },
      },
    },
    stopping: {
      entry: 'stopModels',
      on: {
        MODELS_STOPPED: 'stopped',
        MODELS_STOP_TIMED_OUT: { target: 'failed', actions: 'recordStopTimeout' },
      },
    },
    stopped: { type: 'final' },
    failed: { type: 'final' },
  },
  on: {
    GROUP_FAILED: { target: '.failed', actions: ['recordGroupFailure', 'haltModels'] },
    COORDINATOR_STATE: { actions: 'recordCoordinatorState' },
    KEEPER_BACK: { actions: 'keepAgain' },
    TELL_GROUP: { actions: 'tellGroup' },
    MODEL_RELOAD: { actions: 'emitModelStale' },
  },
});

// The status's NodeState names exactly these states.
true satisfies SameStateNames<StateValueFrom<typeof supervisorMachine>, NodeState>;

/** node.json: the models as the registry lists them (src/models/modelRegistryMachine.ts), and the group. */
function manifestOf(context: SupervisorContext, listing: ModelListing): PublishNodeManifestInput['manifest'] {
  return { ...listing, group: { nodeRank: context.config.nodeRank, nnodes: context.config.nnodes, tpSize: context.config.tpSize, rankTable: context.rankTable } };
}

function toFailure(err: unknown): NodeFailure {
  const e = err as Partial<SerializedError> & Error;
  return { name: e?.name ?? 'Error', code: e?.code ?? 'E_INTERNAL', message: e?.message ?? String(err), details: e?.details, stack: e?.stack };
}
