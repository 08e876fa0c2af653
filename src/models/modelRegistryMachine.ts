// The models a node serves, as one machine: it spawns a model actor for each (those the node starts
// with, then each node.load), keeps their list (ModelEntry), drains the older versions of a name
// once a newer one serves, drops a model that failed or was released, routes node 0's verdicts on
// a model that spans the group to that model's actor, and says what the node must do or tell its
// group. The supervisor (src/machines/supervisor.ts) spawns it once the group is joined and keeps
// the node's life; like the model machine it holds no I/O, and its model actor is a placeholder
// that the composition root provides (src/actors/nodeActors.ts).
import { assertEvent, enqueueActions, setup, type AnyActorRef, type StateValueFrom } from 'xstate';
import type { RegistryState, SameStateNames } from '../nodeStatus.js';
import type { NodeManifestModel } from '../wire/nodeManifest.js';
import type { GroupCommand, GroupEvent } from '../rendezvous/groupEvents.js';
import { keptLoadOf } from './keptLoad.js';
import { manifestDigest } from '../keeper/writtenIdentity.js';
import { modelActorId, modelFailureMessage, type ModelEntry, type ModelEvent, type ModelListing, type ModelRegistryReport, type ModelRequestEvent, type VouchedVersion } from './modelHost.js';
import { FORMS_GROUP, LOADED_BESIDE, modelMachine, type ModelHostInput, type ModelInput } from './modelMachine.js';
import type { PlannedModel } from './planModel.js';
import type { RankKeeping } from './rankMessages.js';

export interface ModelRegistryInput extends ModelHostInput {
  /**
   * Who hears what the registry reports (ModelRegistryReport): the supervisor. An input rather
   * than sendParent, so that xstate/graph can walk the machine alone (test/models/modelRegistry.paths).
   */
  node: AnyActorRef;
  /** The models the node starts with, planned (Prepared.models): the first is the one its group formed around. */
  startup: PlannedModel[];
}

export interface ModelRegistryContext extends ModelRegistryInput {
  /** The model versions the node serves, oldest first, the node's first model first. */
  models: ModelEntry[];
  /** The versions it vouched for in swaps across the group, with their verdicts (ModelControl.load waits on them). */
  vouched: VouchedVersion[];
}

/** What the supervisor sends the registry: the node stops, the node failed (its models end with it), the keeper is back. */
export type ModelRegistryCommand = { type: 'MODELS_STOP' } | { type: 'MODELS_HALT' } | { type: 'KEEPER_BACK' };

/** What the group tells this node of a model that spans it (src/models/modelGroupMachine.ts), as the supervisor forwards it. */
export type ModelGroupVerdict = Extract<GroupEvent, { type: 'MODEL_GROUP_COMMIT' | 'MODEL_GROUP_ABORT' }>;

export type ModelRegistryEvent = ModelEvent | ModelRequestEvent | ModelRegistryCommand | ModelGroupVerdict;

/** How long ranks get to free their devices after MODELS_STOP before the node gives up on them. */
export const STOP_TIMEOUT_MS = 30_000;

const registrySetup = setup({
  types: {
    context: {} as ModelRegistryContext,
    events: {} as ModelRegistryEvent,
    input: {} as ModelRegistryInput,
  },
  actors: {
    /** Every model the node serves, its first included; its rank and serve actors are placeholders too (src/models/modelMachine.ts). */
    model: modelMachine,
  },
  delays: { stopTimeout: STOP_TIMEOUT_MS },
  guards: {
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
    // The node's first model, placed by the rendezvous, joins as FORMS_GROUP; the others load beside it.
    spawnStartupModels: enqueueActions(({ context, enqueue, self }) => {
      const models = context.startup.map((planned, n) => {
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
        enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_JOIN', name, fingerprint, fingerprintFields, tpSize: planned.spec.tpSize }));
      }
    }),
    // The group's model binds its sockets: the node is starting.
    tellNodeStarting: enqueueActions(({ context, enqueue }) => enqueue.sendTo(context.node, { type: 'GROUP_MODEL_STARTING' } satisfies ModelRegistryReport)),
    // Every model the node started with serves: the node is ready, its group compares the first model's digests.
    tellNodeServing: enqueueActions(({ context, enqueue }) =>
      enqueue.sendTo(context.node, { type: 'STARTUP_MODELS_SERVING', digests: context.models.find((m) => m.formsGroup)?.digests, listing: listingOf(context) } satisfies ModelRegistryReport)),
    tellNodeFailed: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_FAILED');
      enqueue.sendTo(context.node, { type: 'MODEL_FAILS_NODE', failure: event.error } satisfies ModelRegistryReport);
    }),
    tellNodeListing: enqueueActions(({ context, enqueue }) => enqueue.sendTo(context.node, { type: 'MODELS_LISTED', listing: listingOf(context) } satisfies ModelRegistryReport)),
    tellGroupPlanFailed: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_PLAN_FAILED');
      enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_FAILED', name: event.name, error: event.error }));
    }),
    tellGroupResident: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_RESIDENT');
      const m = context.models.find((x) => x.id === event.id);
      if (m?.group !== 'pending') return;
      context.log.info({ model: m.name, fingerprint: m.fingerprint }, `model "${m.name}" is resident here; waiting for node 0's commit`);
      enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_RESIDENT', name: m.name, fingerprint: m.fingerprint }));
    }),
    // A reload across the group (src/models/groupReload.ts): this node's word to node 0.
    tellGroupStale: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_GROUP_STALE');
      enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_STALE', name: event.name, fingerprint: event.fingerprint }));
    }),
    vouchToGroup: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_GROUP_VOUCH');
      const { name, fingerprint } = event.join;
      enqueue.assign({ vouched: [...liveVouches(context.vouched.filter((v) => v.name !== name), context.models), { id: event.id, name, fingerprint }] });
      enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_JOIN', ...event.join }));
      enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_RESIDENT', name, fingerprint }));
    }),
    // A node that fails a swap across nodes fails it everywhere.
    tellGroupFailed: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_FAILED');
      const m = context.models.find((x) => x.id === event.id);
      if (m?.group === 'pending') enqueue.sendTo(context.node, tellGroup({ type: 'MODEL_GROUP_FAILED', name: m.name, fingerprint: m.fingerprint, error: event.error }));
    }),
    // Node 0's verdict on a model that spans the group, to the model actor of that version.
    applyGroupVerdict: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, ['MODEL_GROUP_COMMIT', 'MODEL_GROUP_ABORT']);
      const m = context.models.find((x) => x.group === 'pending' && x.name === event.name && x.fingerprint === event.fingerprint);
      if (!m) {
        // A version this node only vouched for (a reload across the group, src/models/groupReload.ts, or a ctl load of what it serves): it loaded nothing.
        const vouch = context.vouched.find((v) => v.name === event.name && v.fingerprint === event.fingerprint && v.verdict === undefined);
        if (event.type === 'MODEL_GROUP_ABORT') context.log.error({ model: event.name, code: event.error.code }, `model "${event.name}" was not loaded again across the group: ${event.error.message}`);
        if (vouch) {
          const verdict = event.type === 'MODEL_GROUP_COMMIT' ? { committed: true as const } : { error: event.error };
          enqueue.assign({ vouched: context.vouched.map((v) => (v === vouch ? { ...v, verdict } : v)) });
        }
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
    // A model's files changed: it drains itself (src/models/modelMachine.ts) and the node loads it again.
    recordModelStale: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_STALE');
      context.log.warn({ model: event.spec.name, files: event.changes }, staleMessage(event.spec.name, event.described));
      enqueue.assign({ models: context.models.map((m) => (m.id === event.id ? { ...m, unloaded: true } : m)) });
      enqueue.sendTo(context.node, { type: 'MODEL_RELOAD', spec: event.spec } satisfies ModelRegistryReport);
    }),
    unloadModels: enqueueActions(({ context, event, enqueue }) => {
      assertEvent(event, 'MODEL_UNLOAD');
      // Only those still listed: one dropped meanwhile has no actor left to tell.
      for (const id of event.ids) if (context.models.some((m) => m.id === id)) enqueue.sendTo(id, { type: 'MODEL_UNLOAD', force: event.force });
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
      const models = context.models.filter((x) => x.id !== event.id);
      enqueue.assign({ models, vouched: liveVouches(context.vouched, models) });
    }),
    // Each model passes it to its ranks; a rank not loaded yet keeps its segments once it is.
    keepAgain: enqueueActions(({ context, enqueue }) => {
      for (const m of context.models) if (!m.gone) enqueue.sendTo(m.id, { type: 'KEEPER_BACK' });
    }),
    stopModels: enqueueActions(({ context, enqueue }) => {
      for (const m of context.models) if (!m.gone) enqueue.sendTo(m.id, { type: 'MODEL_STOP' });
    }),
    tellNodeStopped: enqueueActions(({ context, enqueue }) => enqueue.sendTo(context.node, { type: 'MODELS_STOPPED' } satisfies ModelRegistryReport)),
    // The node fails; the models' actors are stopped with it, and their ranks' threads terminated.
    tellNodeStopTimedOut: enqueueActions(({ context, enqueue }) => {
      const running = context.models.filter((m) => !m.gone).map((m) => `"${m.name}"`);
      const failure = { name: 'RankFailedError', code: 'E_STOP_TIMEOUT', message: `the ranks of models ${running.join(', ')} did not stop within ${STOP_TIMEOUT_MS / 1000} s; their threads were terminated` };
      enqueue.sendTo(context.node, { type: 'MODELS_STOP_TIMED_OUT', failure } satisfies ModelRegistryReport);
    }),
  },
});

/**
 * Before the node is ready, the models it starts with load; the failure of one on its command
 * line fails the node, that of one restored from the keeper fails that model alone.
 */
export const modelRegistryMachine = registrySetup.createMachine({
  id: 'modelRegistry',
  initial: 'startup',
  context: ({ input }) => ({ ...input, models: [], vouched: [] }),
  states: {
    // The models the node starts with load, each a model actor; the first is the group's.
    startup: {
      entry: 'spawnStartupModels',
      on: {
        MODEL_STARTING: { guard: 'formsGroup', actions: 'tellNodeStarting' },
        MODEL_SERVING: { actions: 'recordModelServing' },
        MODEL_FAILED: [{ guard: 'failsTheNode', target: 'halted', actions: 'tellNodeFailed' }, { actions: 'dropModel' }],
        MODEL_GONE: { actions: 'dropModel' },
        MODEL_STALE: { actions: 'recordModelStale' },
      },
      always: { guard: 'startupModelsServing', target: 'running', actions: 'tellNodeServing' },
    },
    // The node is ready: models load and unload beside the first, and swap across the group.
    running: {
      on: {
        MODEL_LOAD: { actions: 'spawnModel' },
        MODEL_SERVING: { actions: ['recordModelServing', 'tellNodeListing'] },
        MODEL_STALE: { actions: ['recordModelStale', 'tellNodeListing'] },
        MODEL_UNLOAD: { actions: ['unloadModels', 'tellNodeListing'] },
        MODEL_GONE: { actions: ['dropModel', 'tellNodeListing'] },
        // The group's model fails the node in any state; any other is gone alone.
        MODEL_FAILED: [{ guard: 'formsGroup', target: 'halted', actions: 'tellNodeFailed' }, { actions: ['tellGroupFailed', 'dropModel', 'tellNodeListing'] }],
        MODEL_RESIDENT: { actions: 'tellGroupResident' },
        MODEL_PLAN_FAILED: { actions: 'tellGroupPlanFailed' },
        MODEL_GROUP_COMMIT: { actions: 'applyGroupVerdict' },
        MODEL_GROUP_ABORT: { actions: 'applyGroupVerdict' },
        MODEL_GROUP_STALE: { actions: 'tellGroupStale' },
        MODEL_GROUP_VOUCH: { actions: 'vouchToGroup' },
      },
    },
    // The node stops: every model stops its ranks, within STOP_TIMEOUT_MS.
    stopping: {
      entry: 'stopModels',
      on: { MODEL_GONE: { actions: 'dropModel' }, MODEL_FAILED: { actions: 'dropModel' } },
      always: { guard: 'allModelsGone', target: 'stopped' },
      after: { stopTimeout: 'stopTimedOut' },
    },
    stopped: { type: 'final', entry: 'tellNodeStopped' },
    stopTimedOut: { type: 'final', entry: 'tellNodeStopTimedOut' },
    // The node failed (through a model of its own, or told MODELS_HALT): ending here, not stopped
    // from outside, keeps each model actor's last snapshot, so the node's status still shows its
    // models' ranks and failures.
    halted: { type: 'final' },
  },
  on: {
    MODELS_STOP: '.stopping',
    MODELS_HALT: '.halted',
    KEEPER_BACK: { actions: 'keepAgain' },
  },
});

true satisfies SameStateNames<StateValueFrom<typeof modelRegistryMachine>, RegistryState>;

/** A command for the group session, which the supervisor holds: it passes it on. */
function tellGroup(command: GroupCommand): ModelRegistryReport {
  return { type: 'TELL_GROUP', command };
}

function modelInput(context: ModelRegistryContext, parent: AnyActorRef, id: string, planned: PlannedModel, startup: boolean, formsGroup: boolean): ModelInput {
  return {
    id,
    parent,
    planned,
    startup,
    join: formsGroup ? FORMS_GROUP : LOADED_BESIDE,
    socketDir: context.socketDir,
    cudaHandles: context.cudaHandles,
    keeper: context.keeper && { ...context.keeper, model: planned.spec.modelDir, ...keptOrigin(planned) },
    log: context.log.child({ model: planned.spec.name }),
    rankWorker: context.rankWorker,
    workers: context.workers,
    servers: context.servers,
  };
}

/**
 * What a model's kept records say of where it comes from: a load at run time its request (a
 * restart restores it), a written version its name, number, base and fields (a restart serves it
 * from its kept segments alone: src/actors/restoreWritten.ts), the command line's nothing; and a
 * checkpoint version its plan (src/keeper/keptPlan.ts: a written version's layout is its
 * checkpoint version's, planned at the restart, so it carries none).
 */
function keptOrigin(planned: PlannedModel): Pick<RankKeeping, 'load' | 'written' | 'currentSince' | 'plan'> {
  const origin = planned.origin ?? 'start';
  if (origin === 'start') return { plan: planned.keptPlan };
  if (origin !== 'update') return { load: keptLoadOf(planned.spec, planned.plan.fingerprint), plan: planned.keptPlan };
  const written = { name: planned.spec.name, version: planned.version!, base: planned.base!, fields: planned.plan.fingerprintFields, manifest: manifestDigest(planned.plan.ranks) };
  return { written, ...(planned.currentSince !== undefined ? { currentSince: planned.currentSince } : {}) };
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
 * The models' part of node.json: every model that serves or drains, and as `entries` (what a
 * client that names no model reads, as before several models) the ranks of the newest version of
 * the node's first model's name that serves, else of one that drains.
 */
function listingOf(context: ModelRegistryContext): ModelListing {
  const listed = context.models.filter((m) => m.entries && !m.gone);
  const models: NodeManifestModel[] = listed.map((m) => ({ name: m.name, fingerprint: m.fingerprint, tpSize: m.tpSize, draining: m.unloaded, ranks: m.entries! }));
  const first = listed.filter((m) => m.name === context.startup[0]!.spec.name);
  return { entries: (first.findLast((m) => !m.unloaded) ?? first.at(-1))?.entries ?? [], models };
}

/**
 * The vouches still worth keeping: one awaiting node 0's verdict (ModelControl waits on it), or one
 * settled whose name the node still serves. A settled one was read by its waiter in the step that
 * settled it, so once its name is gone nothing reads it again: without this, each name ever
 * vouched for kept its entry for the daemon's life.
 */
function liveVouches(vouched: VouchedVersion[], models: ModelEntry[]): VouchedVersion[] {
  return vouched.filter((v) => v.verdict === undefined || models.some((m) => m.name === v.name && !m.gone));
}

/** The log line of a model found stale, naming each file and how it changed. */
function staleMessage(name: string, described: string): string {
  return `model "${name}" is stale: its checkpoint files changed since it was loaded (${described}); it takes no new lease from now on (clients load from disk), its leases keep their memory until they end, and it is loaded again`;
}
