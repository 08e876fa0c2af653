// Model-based test of the supervisor: xstate/graph enumerates the paths through the machine
// (with every event it can receive), and each path is replayed against a live actor built with
// fake children, checking at every step what the machine must have done in that state.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor } from 'xstate';
import { getShortestPaths, getSimplePaths } from 'xstate/graph';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { rankActorId } from '../../src/models/modelRanks.js';
import { FakeWorld, LOCAL_RANKS, fakeInput, fakePrepared, fakeRankTable } from '../helpers/fakeNode.js';

type Ev = Parameters<ReturnType<typeof createActor<typeof supervisorMachine>>['send']>[0];
const fakeDevice = (r: number) => ({ backend: 'host', index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });
const err = { name: 'DeviceError', code: 'E_TEST', message: 'boom' };
const ranks = [...Array(LOCAL_RANKS).keys()];
const events = [
  { type: 'xstate.done.actor.prepare', output: fakePrepared },
  { type: 'xstate.error.actor.prepare', error: new Error('bad checkpoint') },
  { type: 'GROUP_JOINED', rankTable: fakeRankTable },
  { type: 'GROUP_READY' },
  { type: 'GROUP_FAILED', error: err },
  { type: 'PEER_LOST', nodeRank: 1, reason: 'heartbeat' },
  { type: 'STOP' },
  { type: 'xstate.after.stopTimeout.supervisor.stopping' },
  ...ranks.flatMap((r) => [
    { type: 'RANK_LOADED', localRank: r, device: fakeDevice(r), segments: [], bytes: 256, seconds: 0.1, source: { from: 'checkpoint' } },
    { type: 'RANK_SERVING', localRank: r, socketPath: `/fake/sockets/fake-${r}.sock` },
    { type: 'RANK_STOPPED', localRank: r },
    { type: 'RANK_FAILED', localRank: r, error: err },
  ]),
] as unknown as Ev[];

const options = {
  input: fakeInput(),
  events,
  // Context holds a logger; a path's identity is its state and the ranks' states.
  serializeState: (s: any) => JSON.stringify([s.value, s.context.ranks.map((r: any) => r.state), s.context.groupReady, s.context.failure?.code ?? null]),
};

function replay(steps: Array<{ event: { type: string } }>) {
  const world = new FakeWorld();
  const actor = createActor(supervisorMachine.provide(world.implementations()), { input: fakeInput() });
  const errors: unknown[] = [];
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  const visited: Array<{ from: string; state: string; world: FakeWorld; snap: ReturnType<typeof actor.getSnapshot> }> = [];
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
function check(snap: any, world: FakeWorld, event: Ev, hadFailure: boolean) {
  const state = String(snap.value);
  const where = `${state} after ${event.type}`;
  if (state === 'starting' || state === 'ready') {
    assert.equal([...world.liveServers].sort(), ranks, `${where}: one server per rank, spawned only once all loaded`);
  }
  if (state === 'loading') assert.is(world.liveServers.size, 0, `${where}: no socket before the weights are resident`);
  assert.is(world.manifestLive, state === 'ready', `${where}: the node manifest exists exactly while ready`);
  if (state === 'loading' || state === 'starting' || state === 'ready') {
    assert.equal(world.liveRanks.size, LOCAL_RANKS, `${where}: one live rank actor per local rank`);
    for (const r of ranks) assert.ok(snap.children[rankActorId(r)], `${where}: rank ${r} is a child`);
  }
  if (state === 'ready') {
    assert.ok(world.groupCommands.some((c) => c.type === 'NODE_READY'), `${where}: the group was told this node is ready`);
    assert.ok(snap.context.ranks.every((r: any) => r.state === 'serving' || r.state === 'released'), `${where}: every rank serving`);
  }
  if (state === 'stopping') {
    assert.is(world.liveServers.size, 0, `${where}: servers stop before memory is freed`);
    for (const r of ranks) {
      if (snap.context.ranks[r].state !== 'stopped') {
        assert.ok(world.rankCommands.some((c) => c.localRank === r && c.cmd.type === 'RANK_STOP'), `${where}: rank ${r} was told to stop`);
      }
    }
  }
  if (state === 'failed' || state === 'stopped') {
    assert.is(snap.status, 'done', `${where}: final`);
    assert.is(world.liveRanks.size, 0, `${where}: every rank actor was stopped (teardown)`);
    assert.is(world.groupLive, false, `${where}: the group session was closed`);
    assert.is(world.liveServers.size, 0, `${where}: every socket server was closed`);
  }
  if (state === 'failed') {
    assert.ok(snap.context.failure?.message, `${where}: the failure is recorded`);
    if (event.type === 'RANK_FAILED' && !hadFailure) {
      assert.match(snap.context.failure.message, /rank \d+ \(local \d+\) failed/, `${where}: the failure names the rank`);
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

test('a rank that fails while others load is named, and the first failure wins', () => {
  const visited = replay([
    { event: events[0]! },
    { event: events[2]! },
    { event: { type: 'RANK_LOADED', localRank: 0, device: fakeDevice(0), segments: [], bytes: 1, seconds: 0, source: { from: 'checkpoint' } } as Ev },
    { event: { type: 'RANK_FAILED', localRank: 1, error: { ...err, message: 'cuMemAlloc failed' } } as Ev },
  ]);
  const last = visited.at(-1)!;
  assert.is(last.state, 'failed');
  assert.is(last.snap.context.failure?.globalRank, 1);
  assert.match(last.snap.context.failure!.message, /rank 1 \(local 1\) failed: cuMemAlloc failed/);
});

test('a node of a group that fails before joining reports it to node 0, then fails; node 0 does not', () => {
  for (const nodeRank of [1, 0]) {
    const world = new FakeWorld();
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

test('a client release frees that rank through its worker, then answers the server', () => {
  const world = new FakeWorld();
  const actor = createActor(supervisorMachine.provide(world.implementations()), { input: fakeInput() });
  actor.start();
  for (const e of [
    events[0],
    events[2],
    ...ranks.map((r) => ({ type: 'RANK_LOADED', localRank: r, device: fakeDevice(r), segments: [], bytes: 1, seconds: 0, source: { from: 'checkpoint' } })),
    ...ranks.map((r) => ({ type: 'RANK_SERVING', localRank: r, socketPath: `/s/${r}` })),
  ]) actor.send(e as Ev);
  assert.is(actor.getSnapshot().value, 'ready');
  actor.send({ type: 'RANK_RELEASE_REQUESTED', localRank: 1 });
  assert.equal(world.rankCommands.filter((c) => c.cmd.type === 'RANK_RELEASE').map((c) => c.localRank), [1]);
  assert.equal(world.serveCommands, [], 'the client hears nothing before the memory is freed');
  actor.send({ type: 'RANK_RELEASED', localRank: 1 });
  assert.equal(world.serveCommands, [{ localRank: 1, cmd: { type: 'SERVE_RELEASED' } }]);
  assert.is(actor.getSnapshot().context.ranks[1]!.state, 'released');
  assert.is(actor.getSnapshot().value, 'ready', 'the other rank keeps serving');
  actor.stop();
});

test.run();
