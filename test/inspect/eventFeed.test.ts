// The event feed reads cause then effects: each event the supervisor handled, with the state
// it left and reached, followed by the commands it sent its children because of it. Progress
// is sampled, handles never leave the node, and the feed is bounded.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, type AnyActorRef } from 'xstate';
import { EventFeed, PROGRESS_SAMPLE_MS, summarizeEvent, type NodeEvent } from '../../src/inspect/eventFeed.js';
import { stateName } from '../../src/inspect/stateName.js';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { FakeWorld, sendToNode, fakeInput, fakePlanned, fakePrepared, fakeRankTable } from '../helpers/fakeNode.js';
import { MODEL_REGISTRY_ID, modelActor } from '../../src/models/modelHost.js';

type Ev = Parameters<ReturnType<typeof createActor<typeof supervisorMachine>>['send']>[0];
const device = (r: number) => ({ backend: 'host' as const, index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });
const SECRET_HANDLE = 'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=';

function start(feed: EventFeed) {
  const world = new FakeWorld();
  const actor = createActor(supervisorMachine.provide(world.implementations()), { input: fakeInput(), inspect: feed.inspect });
  actor.subscribe({ error: (e) => assert.unreachable(`machine error: ${String(e)}`) });
  actor.start();
  const send = (e: unknown) => sendToNode(actor, e as Ev);
  return { actor, send };
}

function toReady(send: (e: unknown) => void) {
  send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
  send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
  for (const r of [0, 1]) send({ type: 'RANK_DEVICE', localRank: r, info: device(r) });
  for (const r of [0, 1]) {
    send({ type: 'RANK_LOADED', localRank: r, device: device(r), segments: [{ segment: 0, bytes: 256, handle: SECRET_HANDLE }], bytes: 256, seconds: 0.5, source: { from: 'checkpoint' } });
  }
  for (const r of [0, 1]) send({ type: 'RANK_SERVING', localRank: r, socketPath: `/fake/sockets/fake-${r}.sock` });
}

const brief = (e: NodeEvent) => (e.model ? `${e.model}: ` : e.registry ? 'models: ' : '') + (e.to ? `${e.type}->${e.to}` : `${e.type}${e.from ? ` ${e.from}->${e.state}` : ''}`);

test('cause before effects, with the states moved between, through a whole life', () => {
  const feed = new EventFeed();
  const seen: NodeEvent[] = [];
  feed.subscribe((e) => seen.push(e));
  const { actor, send } = start(feed);
  toReady(send);
  send({ type: 'STOP' });
  for (const r of [0, 1]) send({ type: 'RANK_STOPPED', localRank: r });
  assert.is(actor.getSnapshot().value, 'stopped');
  const log = feed.recent().map(brief);
  const expected = [
    'xstate.init',
    'xstate.init->prepare',
    'xstate.done.actor.prepare init->rendezvous',
    'xstate.init->group',
    'GROUP_JOINED rendezvous->loading',
    // The model registry's events and a model actor's say whose they are, each after its cause.
    'xstate.init->models',
    'models: xstate.init',
    'models: xstate.init->model-0',
    'model-0: xstate.init',
    'model-0: xstate.init->rank-0',
    'model-0: xstate.init->rank-1',
    'model-0: RANK_DEVICE',
    'model-0: RANK_DEVICE',
    'model-0: RANK_LOADED',
    'model-0: RANK_LOADED loading->verifying',
    'model-0: xstate.init->checkFiles',
    'model-0: xstate.done.actor.checkFiles verifying->starting',
    'model-0: xstate.init->serve-0',
    'model-0: xstate.init->serve-1',
    'models: MODEL_STARTING',
    'GROUP_MODEL_STARTING loading->starting',
    'model-0: RANK_SERVING',
    'model-0: RANK_SERVING starting->serving',
    'model-0: SERVE_ANNOUNCE->serve-0',
    'model-0: SERVE_ANNOUNCE->serve-1',
    'models: MODEL_SERVING startup->running',
    'STARTUP_MODELS_SERVING starting->ready',
    'NODE_READY->group',
    'STOP ready->stopping',
    'MODELS_STOP->models',
    'models: MODELS_STOP running->stopping',
    'models: MODEL_STOP->model-0',
    'model-0: MODEL_STOP serving->stopping',
    'model-0: RANK_STOP->rank-0',
    'model-0: RANK_STOP->rank-1',
    'model-0: RANK_STOPPED',
    'model-0: RANK_STOPPED stopping->stopped',
    'models: MODEL_GONE stopping->stopped',
    'MODELS_STOPPED stopping->stopped',
  ];
  assert.equal(log.filter((l) => l !== 'xstate.init->publishManifest'), expected);
  assert.equal(seen, feed.recent(), 'listeners see exactly what the feed keeps');
  assert.equal(seen.map((e) => e.seq), seen.map((_, i) => i + 1));
  const stop = seen.find((e) => e.type === 'STOP')!;
  assert.is(stop.state, 'stopping');
  assert.ok(seen.every((e) => typeof e.time === 'number' && Math.abs(e.time - Date.now()) < 10_000));
});

test('an actor that ends is forgotten: a node that loads and drops models keeps no state per model it once had', () => {
  const feed = new EventFeed();
  const { actor, send } = start(feed);
  toReady(send);
  const alive = feed.followed;
  for (const n of [1, 2, 3]) {
    const id = `load-${n}`;
    const planned = { ...fakePlanned, spec: { ...fakePlanned.spec, name: `draft-${n}` }, plan: { ...fakePlanned.plan, fingerprint: String(n).repeat(64) } };
    send({ type: 'MODEL_LOAD', id, planned });
    const model = modelActor(actor.getSnapshot(), id)!;
    assert.ok(model, `${id} was spawned`);
    model.send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 1, totalBytes: 2, seconds: 0 } as never);
    assert.is(feed.followed, alive + 1, `${id} is followed while it lives`);
    model.send({ type: 'RANK_FAILED', localRank: 0, error: { name: 'DeviceError', code: 'E_DEVICE_LOST', message: 'device lost' } } as never);
    assert.is(modelActor(actor.getSnapshot(), id), undefined, `${id} failed and was dropped`);
    assert.is(feed.followed, alive, `${id} is forgotten once it ended`);
  }
  assert.is(actor.getSnapshot().value, 'ready');
  actor.stop();
});

test('each event is labelled as an operator reads it: no xstate names, no generated actor ids', () => {
  const feed = new EventFeed();
  const { actor, send } = start(feed);
  toReady(send);
  send({ type: 'STOP' });
  (actor.getSnapshot().children[MODEL_REGISTRY_ID] as AnyActorRef).send({ type: 'xstate.after.stopTimeout.modelRegistry.stopping' });
  const labels = feed.recent().map((e) => (e.to ? `${e.label} -> ${e.to}` : e.label));
  for (const l of ['start', 'start prepare -> prepare', 'prepare done', 'start group -> group', 'start publishManifest -> publishManifest', 'NODE_READY -> group', 'stopTimeout passed']) {
    assert.ok(labels.includes(l), `"${l}" in ${JSON.stringify(labels)}`);
  }
  const leaks = feed.recent().filter((e) => /xstate\.|^\d+\./.test(`${e.label} ${e.to ?? ''}`));
  assert.equal(leaks, [], 'nothing internal shows');
  const failed = new EventFeed();
  start(failed).send({ type: 'xstate.error.actor.prepare', error: new Error('bad checkpoint') });
  assert.ok(failed.recent().some((e) => e.label === 'prepare failed'));
});

test('timestamps never go back as the sequence numbers go up, commands included', () => {
  // A clock that moves on every reading: a command stamped when it is sent, before the event
  // that caused it is published, would then carry an earlier time than that event.
  const realNow = Date.now;
  let t = 1_700_000_000_000;
  Date.now = () => (t += 1);
  try {
    const feed = new EventFeed();
    toReady(start(feed).send);
    const events = feed.recent();
    assert.ok(events.some((e) => e.to !== undefined), 'commands are in the feed');
    for (let i = 1; i < events.length; i++) {
      assert.ok(events[i]!.time >= events[i - 1]!.time, `#${events[i]!.seq} ${events[i]!.label} at ${events[i]!.time} after #${events[i - 1]!.seq} at ${events[i - 1]!.time}`);
    }
  } finally {
    Date.now = realNow;
  }
});

test('segment handles and other objects never reach the feed', () => {
  const feed = new EventFeed();
  const { send } = start(feed);
  toReady(send);
  const text = JSON.stringify(feed.recent());
  assert.not.ok(text.includes(SECRET_HANDLE), 'no IPC handle in the feed');
  const loaded = feed.recent().find((e) => e.type === 'RANK_LOADED')!;
  assert.equal(loaded.data, { localRank: 0, device: { backend: 'host', index: 0, uuid: 'fake-0', name: 'fake' }, segments: 1, bytes: 256, seconds: 0.5 });
  const prepared = feed.recent().find((e) => e.type === 'xstate.done.actor.prepare')!;
  assert.not.ok('output' in prepared.data, 'the prepared plan (locks, file paths) is left out');
});

test('summarizeEvent keeps node ranks, counts other lists, drops the done event\'s actorId', () => {
  assert.equal(summarizeEvent({ type: 'GROUP_WAITING', joined: [0, 2], missing: [1] }), { joined: [0, 2], missing: [1] });
  assert.equal(summarizeEvent({ type: 'X', segments: [{ handle: 'h' }], many: Array.from({ length: 65 }, (_, i) => i) }), { segments: 1, many: 65 });
  assert.equal(summarizeEvent({ type: 'xstate.done.actor.prepare', actorId: 'prepare' }), {});
});

test('summarizeEvent keeps errors as code and message, long strings cut', () => {
  const err = Object.assign(new Error('disk on fire'), { code: 'E_DISK' });
  assert.equal(summarizeEvent({ type: 'X', error: err, note: 'y'.repeat(600), ok: true, n: null }), {
    error: { code: 'E_DISK', name: 'Error', message: 'disk on fire' },
    note: `${'y'.repeat(512)}…`,
    ok: true,
  });
  assert.equal(summarizeEvent({ type: 'X', error: { name: 'DeviceError', code: 'E_OOM', message: 'full' } }).error, { code: 'E_OOM', name: 'DeviceError', message: 'full' });
});

test('progress is sampled per rank; a state change is always kept', () => {
  const feed = new EventFeed();
  const { send } = start(feed);
  send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
  send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
  for (let i = 0; i < 50; i++) {
    for (const r of [0, 1]) send({ type: 'RANK_PROGRESS', localRank: r, bytes: i, totalBytes: 256, seconds: i / 100 });
  }
  const progress = feed.recent().filter((e) => e.type === 'RANK_PROGRESS');
  assert.equal(progress.map((e) => [e.data.localRank, e.data.bytes]), [[0, 0], [1, 0]], `one per rank per ${PROGRESS_SAMPLE_MS} ms`);
});

test('the feed keeps the newest events up to its capacity', () => {
  const small = new EventFeed(5);
  toReady(start(small).send);
  const all = new EventFeed();
  toReady(start(all).send);
  const key = (e: NodeEvent) => `${e.seq} ${brief(e)}`;
  assert.ok(all.recent().length > 5);
  assert.equal(small.recent().map(key), all.recent().slice(-5).map(key));
});

test('a throwing listener neither breaks the machine nor other listeners', async () => {
  const feed = new EventFeed();
  const other: string[] = [];
  feed.subscribe(() => {
    throw new Error('listener bug');
  });
  feed.subscribe((e) => other.push(e.type));
  const uncaught: unknown[] = [];
  const onUncaught = (err: unknown) => uncaught.push(err);
  process.on('uncaughtException', onUncaught);
  try {
    const { actor, send } = start(feed);
    toReady(send);
    assert.is(actor.getSnapshot().value, 'ready');
    assert.ok(other.includes('RANK_SERVING'));
    await new Promise((r) => setTimeout(r, 10));
    assert.ok(uncaught.length > 0 && (uncaught[0] as Error).message === 'listener bug', 'the bug still surfaces');
  } finally {
    process.off('uncaughtException', onUncaught);
  }
});

test('stateName: flat, nested and parallel values', () => {
  assert.is(stateName('ready'), 'ready');
  assert.is(stateName({ outer: 'inner' }), 'outer.inner');
  assert.is(stateName({ both: { a: 'a1', b: 'b1' } }), 'both.a.a1,both.b.b1');
});

test.run();
