// Model-based test of the supervisor: xstate/graph enumerates the paths through the machine
// (with every event it can receive), and each path is replayed against a live actor built with
// fake children, checking at every step what the machine must have done in that state. Its models
// live in the model registry, walked alone in test/models/modelRegistry.paths (and each model
// actor in test/models/modelMachine.paths); here a fake stands in for the registry and the test
// sends what the registry tells the supervisor.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback } from 'xstate';
import { getShortestPaths, getSimplePaths } from 'xstate/graph';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { MODEL_REGISTRY_ID } from '../../src/models/modelHost.js';
import type { ModelRegistryCommand, ModelRegistryInput } from '../../src/models/modelRegistryMachine.js';
import { FakeWorld, LOCAL_RANKS, fakeInput, fakePrepared, fakeRankTable } from '../helpers/fakeNode.js';

type Ev = Parameters<ReturnType<typeof createActor<typeof supervisorMachine>>['send']>[0];
const err = { name: 'DeviceError', code: 'E_TEST', message: 'rank 1 (local 1) failed: boom' };
const entries = [...Array(LOCAL_RANKS).keys()].map((r) => ({ globalRank: r, localRank: r, socketPath: `/fake/sockets/fake-${r}.sock`, deviceUuid: `fake-${r}`, fingerprint: `rank${r}` }));
const events = [
  { type: 'xstate.done.actor.prepare', output: fakePrepared },
  { type: 'xstate.error.actor.prepare', error: new Error('bad checkpoint') },
  { type: 'GROUP_JOINED', rankTable: fakeRankTable },
  { type: 'GROUP_READY' },
  { type: 'GROUP_FAILED', error: err },
  { type: 'PEER_LOST', nodeRank: 1, reason: 'heartbeat' },
  { type: 'STOP' },
  // What the model registry tells the supervisor.
  { type: 'GROUP_MODEL_STARTING' },
  { type: 'STARTUP_MODELS_SERVING', digests: [], listing: { entries, models: [] } },
  { type: 'MODEL_FAILS_NODE', failure: err },
  { type: 'MODELS_STOPPED' },
  { type: 'MODELS_STOP_TIMED_OUT', failure: { name: 'RankFailedError', code: 'E_STOP_TIMEOUT', message: 'did not stop' } },
] as unknown as Ev[];

const options = {
  input: fakeInput(),
  events,
  // Context holds a logger; a path's identity is its state.
  serializeState: (s: any) => JSON.stringify([s.value, s.context.groupReady, s.context.failure?.code ?? null]),
};

/** The supervisor's world, with a fake model registry that records what it is told. */
class World extends FakeWorld {
  registryLive = false;
  registryInput?: ModelRegistryInput;
  registryCommands: ModelRegistryCommand[] = [];
  override implementations() {
    const base = super.implementations();
    const modelRegistry = fromCallback<ModelRegistryCommand, ModelRegistryInput>(({ input, receive }) => {
      this.registryLive = true;
      this.registryInput = input;
      receive((cmd) => this.registryCommands.push(cmd));
      return () => (this.registryLive = false);
    });
    return { actors: { ...base.actors, modelRegistry: modelRegistry as never } };
  }
}

function replay(steps: Array<{ event: { type: string } }>) {
  const world = new World();
  const actor = createActor(supervisorMachine.provide(world.implementations()), { input: fakeInput() });
  const errors: unknown[] = [];
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  const visited: Array<{ from: string; state: string; world: World; snap: ReturnType<typeof actor.getSnapshot> }> = [];
  for (const step of steps) {
    if (step.event.type === 'xstate.init') continue;
    const hadFailure = Boolean(actor.getSnapshot().context.failure);
    const from = String(actor.getSnapshot().value);
    actor.send(step.event as Ev);
    const snap = actor.getSnapshot();
    check(snap, world, step.event as Ev, hadFailure);
    visited.push({ from, state: String(snap.value), world, snap });
  }
  assert.equal(errors, [], 'the machine raised no error');
  actor.stop();
  return visited;
}

/** What must hold in each state, whatever the path that led there. */
function check(snap: any, world: World, event: Ev, hadFailure: boolean) {
  const state = String(snap.value);
  const where = `${state} after ${event.type}`;
  assert.not.ok('models' in snap.context, `${where}: the supervisor keeps no models: its registry does`);
  if (['init', 'rendezvous', 'reportingFailure'].includes(state)) assert.is(world.registryLive, false, `${where}: no model registry before the group formed`);
  if (['loading', 'starting', 'ready', 'stopping'].includes(state)) {
    assert.ok(world.registryLive && snap.children[MODEL_REGISTRY_ID], `${where}: the model registry is a live child`);
    assert.equal(world.registryInput!.startup, fakePrepared.models, `${where}: it starts the models the node prepared, the group's first`);
    assert.is(world.liveRanks.size + world.liveServers.size, 0, `${where}: the supervisor spawns no rank or server itself`);
  }
  assert.is(world.manifestLive, state === 'ready', `${where}: the node manifest exists exactly while ready`);
  if (state === 'ready') assert.ok(world.groupCommands.some((c) => c.type === 'NODE_READY'), `${where}: the group was told this node is ready`);
  if (state === 'stopping') assert.equal(world.registryCommands.filter((c) => c.type === 'MODELS_STOP'), [{ type: 'MODELS_STOP' }], `${where}: the models were told to stop, once`);
  if (state === 'failed' || state === 'stopped') {
    assert.is(snap.status, 'done', `${where}: final`);
    assert.is(world.registryLive, false, `${where}: the model registry, and every model actor with it, was stopped (teardown)`);
    assert.is(world.groupLive, false, `${where}: the group session was closed`);
  }
  if (state === 'failed') {
    assert.ok(snap.context.failure?.message, `${where}: the failure is recorded`);
    if (event.type === 'MODEL_FAILS_NODE' && !hadFailure) {
      assert.is(snap.context.failure.message, err.message, `${where}: the model's failure (naming its rank) is the node's`);
      assert.ok(world.groupCommands.some((c) => c.type === 'NODE_FAILED'), `${where}: peers are told`);
    }
  }
  if (state === 'stopped') assert.is(snap.context.failure, undefined, `${where}: a clean stop records no failure`);
}

test('shortest paths reach every state, and each state holds its invariants', () => {
  const paths = getShortestPaths(supervisorMachine, options);
  const reached = new Set(paths.map((p) => String(p.state.value)));
  for (const s of ['init', 'rendezvous', 'loading', 'starting', 'ready', 'stopping', 'stopped', 'failed']) {
    assert.ok(reached.has(s), `state ${s} is reachable`);
  }
  for (const p of paths) replay(p.steps as any);
});

test('every simple path to a final state tears everything down', () => {
  const paths = getSimplePaths(supervisorMachine, { ...options, toState: (s: any) => s.status === 'done' });
  assert.ok(paths.length > 20, `enumerated ${paths.length} paths`);
  const failedFromEveryState = new Set<string>();
  for (const p of paths) {
    const visited = replay(p.steps as any);
    const last = visited.at(-1)!;
    assert.ok(['stopped', 'failed'].includes(last.state));
    if (last.state === 'failed') failedFromEveryState.add(last.from);
  }
  for (const s of ['init', 'rendezvous', 'loading', 'starting', 'ready', 'stopping']) {
    assert.ok(failedFromEveryState.has(s), `a failure in ${s} is covered`);
  }
});

test("a model failing the node once it is ready fails the node", () => {
  const steps = (...types: string[]) => types.map((type) => ({ event: events.find((e) => e.type === type)! }));
  const failed = replay(steps('xstate.done.actor.prepare', 'GROUP_JOINED', 'GROUP_MODEL_STARTING', 'STARTUP_MODELS_SERVING', 'MODEL_FAILS_NODE')).at(-1)!;
  assert.is(failed.from, 'ready');
  assert.is(failed.state, 'failed');
});

test('a node of a group that fails before joining reports it to node 0, then fails; node 0 does not', () => {
  for (const nodeRank of [1, 0]) {
    const world = new World();
    const input = fakeInput({ nnodes: 2, nodeRank, tpSize: 4 });
    const actor = createActor(supervisorMachine.provide(world.implementations()), { input });
    actor.start();
    actor.send(events[1]!); // planning failed
    if (nodeRank === 0) {
      assert.is(actor.getSnapshot().value, 'failed', 'node 0 hosts the coordinator: nobody to tell yet');
      assert.is(world.failureReports, 0);
      continue;
    }
    assert.is(actor.getSnapshot().value, 'reportingFailure');
    assert.is(world.failureReports, 1);
    assert.match(actor.getSnapshot().context.failure!.message, /bad checkpoint/);
    actor.send({ type: 'xstate.done.actor.reportFailure', output: true } as unknown as Ev);
    assert.is(actor.getSnapshot().value, 'failed');
    assert.is(actor.getSnapshot().status, 'done');
  }
});

test.run();
