// The node's first model (the one its group forms around) is a model actor like every other
// model: the supervisor spawns it once the group formed, it loads as it did before several
// models existed (no admission, no commit round, kept once exported), the node's states follow
// it, and node.unload drains it through that actor. Driven with fake rank, serve and files-check
// actors (test/helpers/fakeNode.ts) under the real supervisor and model machines.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, type ActorRefFrom } from 'xstate';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { modelActor, modelActorId } from '../../src/models/modelHost.js';
import { ModelControl } from '../../src/models/modelControl.js';
import type { modelMachine } from '../../src/models/modelMachine.js';
import { statusOf } from '../../src/startNode.js';
import { FakeWorld, LOCAL_RANKS, fakeInput, fakePrepared, fakeRankTable } from '../helpers/fakeNode.js';

const ranks = [...Array(LOCAL_RANKS).keys()];
const device = (r: number) => ({ backend: 'host', index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });
const keeper = { socket: '/fake/keeper.sock', model: '/fake/model', writer: 'weightd test' };

/** A node past its rendezvous, its first model's actor spawned and returned. */
function joinedNode(prepared = fakePrepared) {
  const world = new FakeWorld();
  const input = fakeInput();
  const actor = createActor(supervisorMachine.provide(world.implementations()), { input });
  actor.start();
  actor.send({ type: 'xstate.done.actor.prepare', output: prepared } as never);
  actor.send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
  const model = modelActor(actor.getSnapshot(), modelActorId(0)) as ActorRefFrom<typeof modelMachine>;
  const status = () => statusOf(actor.getSnapshot(), input.config);
  return { world, input, actor, model, status };
}

/** Its ranks load, its files check out, and its ranks serve. */
function serve(model: ActorRefFrom<typeof modelMachine>) {
  for (const r of ranks) model.send({ type: 'RANK_DEVICE', localRank: r, info: device(r) } as never);
  for (const r of ranks) model.send({ type: 'RANK_LOADED', localRank: r, device: device(r), segments: [], bytes: 256, seconds: 0, source: { from: 'checkpoint' }, digests: [] } as never);
  model.send({ type: 'xstate.done.actor.checkFiles' } as never);
  for (const r of ranks) model.send({ type: 'RANK_SERVING', localRank: r, socketPath: `/fake/sockets/fake-${r}.sock` });
}

test("the node's first model is a model actor: loaded without admission, the node's states follow it, its status as before", () => {
  const { world, actor, model, status } = joinedNode();
  assert.ok(model, 'the first model is the child model-0');
  assert.is(actor.getSnapshot().value, 'loading');
  assert.equal(status().models.map((m) => [m.name, m.own]), [['model', true]]);
  assert.equal(world.rankInputs.map((i) => [i.workerData.localRank, i.workerData.awaitAdmission, i.workerData.keepOnceServing]), [[0, false, false], [1, false, false]], 'its ranks allocate at once and keep once exported, as they always did');
  for (const r of ranks) model.send({ type: 'RANK_DEVICE', localRank: r, info: device(r) } as never);
  assert.is(model.getSnapshot().value, 'loading');
  assert.not.ok(world.rankCommands.some((c) => c.cmd.type === 'RANK_ADMIT'), 'no rank waits for an admission');
  for (const r of ranks) model.send({ type: 'RANK_LOADED', localRank: r, device: device(r), segments: [], bytes: 256, seconds: 0, source: { from: 'checkpoint' }, digests: [] } as never);
  assert.is(actor.getSnapshot().value, 'loading', 'loaded, its files still being checked');
  model.send({ type: 'xstate.done.actor.checkFiles' } as never);
  assert.is(actor.getSnapshot().value, 'starting', "the node is starting while the first model binds its sockets");
  assert.equal([...world.liveServers].sort(), ranks);
  assert.equal(world.serveInputs.map((i) => [i.version, 'own' in i.rank]), [['model-0', false], ['model-0', false]], "served under its model actor's id, as any model; no rank says it is the node's own");
  for (const r of ranks) model.send({ type: 'RANK_SERVING', localRank: r, socketPath: `/fake/sockets/fake-${r}.sock` });
  assert.is(actor.getSnapshot().value, 'ready');
  assert.ok(world.groupCommands.some((c) => c.type === 'NODE_READY'));
  const s = status();
  assert.equal(s.models.map((m) => [m.name, m.own, m.state, m.ranks.length]), [['model', true, 'serving', LOCAL_RANKS]]);
  assert.equal(s.ranks.map((r) => r.state), ['serving', 'serving'], "the node's ranks are its first model's");
  assert.is(s.fingerprint, fakePrepared.models[0]!.plan.fingerprint);
  assert.is(world.rankCommands.filter((c) => c.cmd.type === 'RANK_KEEP').length, 0, 'kept once exported: no KEEP once it serves');
  actor.stop();
});

test('unloading the first model by name drains it through its model actor; released, it stays listed', () => {
  const { world, input, actor, model, status } = joinedNode();
  serve(model);
  const control = new ModelControl({ actor, config: { ...input.config, evict: 'off' }, log: input.log, status, versions: (name) => status().models.filter((m) => m.name === name) });
  const result = control.unload('model');
  assert.equal(result.unloaded.map((u) => u.name), ['model']);
  assert.is(model.getSnapshot().value, 'draining');
  assert.equal(world.serveCommands.filter((c) => c.cmd.type === 'SERVE_DRAIN').map((c) => c.localRank), ranks);
  for (const r of ranks) model.send({ type: 'RANK_RELEASE_REQUESTED', localRank: r });
  for (const r of ranks) model.send({ type: 'RANK_RELEASED', localRank: r });
  assert.is(actor.getSnapshot().value, 'ready', 'the node lives on');
  assert.equal(status().models.map((m) => [m.name, m.own, m.state, m.bytes]), [['model', true, 'released', 0]]);
  assert.throws(() => control.unload('model'), /no loaded model is named or fingerprinted "model"/);
  control.close();
  actor.stop();
});

test('a rank failure of the first model fails the node, names the rank, tells the peers, and leaves what the keeper holds', () => {
  const { world, actor, model } = joinedNode({ ...fakePrepared, keeper });
  serve(model);
  assert.is(actor.getSnapshot().value, 'ready');
  model.send({ type: 'RANK_FAILED', localRank: 1, error: { name: 'DeviceError', code: 'E_DEVICE_LOST', message: 'device lost' } });
  const snap = actor.getSnapshot();
  assert.is(snap.value, 'failed');
  assert.is(snap.context.failure?.message, 'rank 1 (local 1) failed: device lost');
  assert.is(snap.context.failure?.globalRank, 1);
  assert.ok(world.groupCommands.some((c) => c.type === 'NODE_FAILED'), 'peers are told at once');
  assert.is(world.keptDrops, 0, "the keeper keeps the first model's shards for the next start");
  assert.is(world.liveRanks.size + world.liveServers.size, 0, 'every rank and server is gone');
});

test.run();
