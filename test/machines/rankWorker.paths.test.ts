// Model-based test of a rank's worker thread (src/machines/rankWorkerMachine.ts): xstate/graph
// enumerates the paths through the machine with every message the main thread can send, in any
// order, and every phase's and keeper call's outcome; each path is replayed against a live actor
// whose phases are stand-ins that settle only when the path says so. At every step what the
// thread posts and runs must hold: nothing allocated before its admission, the device never freed
// under a keep in flight, no keep before the export or after an UNKEEP, RELEASE or STOP, a
// release dropping the keeper's copies only when no UNKEEP did, a stopped rank's load failure
// never reported, and the port closed once, at the end. A table then checks the exact messages
// of the out-of-order cases.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromPromise, type AnyActorRef } from 'xstate';
import { getShortestPaths } from 'xstate/graph';
import type { RankToMain, RankWorkerData } from '../../src/models/rankMessages.js';
import { rankWorkerActors, rankWorkerMachine } from '../../src/machines/rankWorkerMachine.js';

const keeper = { socket: '/fake/keeper.sock', model: '/fake/model', writer: 'weightd test' };
const base = { nodeRank: 0, localRank: 0, globalRank: 0, plan: { segments: [256], totalBytes: 256 } } as unknown as RankWorkerData;
/** The node's own rank (kept once loaded), a model's rank (admitted, kept once it serves), and a rank with no keeper. */
const configs: Record<string, RankWorkerData> = {
  own: { ...base, keeper },
  model: { ...base, keeper, awaitAdmission: true, keepOnceServing: true },
  noKeeper: { ...base, awaitAdmission: true },
};

type Snap = ReturnType<ReturnType<typeof createActor<typeof rankWorkerMachine>>['getSnapshot']>;
const inFlight = (snap: Snap) => new Set(Object.keys(snap.children as Record<string, AnyActorRef>));

const fakeDevice = { fake: 'device' };
const adopted = (rekeep: boolean) => ({ bytes: 256, seconds: 0.1, source: { from: 'keeper', keptAt: 1, ageMs: 1, thread: 'worker' }, rekeep, digests: ['a'] });
const err = (code: string) => ({ name: 'DeviceError', code, message: `${code} happened` });
const done = (id: string, output?: unknown) => ({ type: `xstate.done.actor.${id}`, output });
const failed = (id: string) => ({ type: `xstate.error.actor.${id}`, error: err(`E_${id.toUpperCase()}`) });

const messages = ['RELEASE', 'STOP', 'KEEP_AGAIN', 'ADMIT', 'KEEP', 'UNKEEP'].map((type) => ({ type }));
/** Every outcome of each phase and keeper call; only one in flight can settle (a stopped one's never reaches the machine). */
const outcomes = [
  done('open', fakeDevice),
  done('adopt', undefined),
  done('adopt', { refused: 'its record was refused' }),
  done('adopt', adopted(false)),
  done('adopt', adopted(true)),
  done('allocate'),
  done('fill', { bytes: 256, seconds: 0.2, digests: ['f'], digestRereadBytes: 0 }),
  done('verify'),
  done('export', [{ fake: 'segment' }]),
  ...['keep', 'dropReleased', 'dropUnloaded', 'freeAfterFailure', 'freeToRelease', 'freeToStop'].map((id) => done(id)),
  ...['open', 'adopt', 'allocate', 'fill', 'verify', 'export', 'keep', 'dropReleased', 'dropUnloaded', 'freeAfterFailure', 'freeToRelease', 'freeToStop'].map(failed),
];
const events = (snap: Snap) => {
  const running = inFlight(snap);
  return [...messages, ...outcomes.filter((e) => running.has(e.type.replace(/^xstate\.(done|error)\.actor\./, '')))];
};

/** The phases, each started and never settled by itself: the path's done and error events settle them. */
const pending = Object.fromEntries(Object.keys(rankWorkerActors).map((src) => [src, fromPromise(() => new Promise<never>(() => {}))])) as unknown as typeof rankWorkerActors;

class World {
  posts: RankToMain[] = [];
  portClosed = 0;
  cancels = 0;
  implementations() {
    return {
      actors: pending,
      actions: {
        post: (_: unknown, m: RankToMain | RankToMain[]) => void this.posts.push(...[m].flat()),
        cancelFill: () => void this.cancels++,
        closePort: () => void this.portClosed++,
      },
    };
  }
}

const posted = (w: World, from: number, type: RankToMain['type']) => w.posts.slice(from).filter((m) => m.type === type);

function replay(data: RankWorkerData, steps: Array<{ type: string }>) {
  const world = new World();
  const errors: unknown[] = [];
  const actor = createActor(rankWorkerMachine.provide(world.implementations()), { input: { data } });
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  const sent: string[] = [];
  for (const event of steps) {
    if (event.type === 'xstate.init') continue;
    const before = actor.getSnapshot();
    if (before.status !== 'active') break;
    const postsBefore = world.posts.length;
    actor.send(event as never);
    sent.push(event.type);
    check({ data, world, before, after: actor.getSnapshot(), event: event.type, sent, postsBefore });
  }
  assert.equal(errors, [], 'the machine raised no error');
  const last = actor.getSnapshot();
  actor.stop();
  return { world, last };
}

function check({ data, world, before, after, event, sent, postsBefore }: { data: RankWorkerData; world: World; before: Snap; after: Snap; event: string; sent: string[]; postsBefore: number }) {
  const where = `${JSON.stringify(after.value)} after ${sent.join(' > ')}`;
  const now = inFlight(after);
  const started = (id: string) => now.has(id) && (!inFlight(before).has(id) || event === `xstate.done.actor.${id}` || event === `xstate.error.actor.${id}`);
  const stopAsked = sent.includes('STOP');
  const unkeepAsked = sent.includes('UNKEEP');

  if (started('allocate') && data.awaitAdmission) assert.ok(sent.includes('ADMIT'), `${where}: nothing is allocated before the rank is admitted`);
  for (const free of ['freeAfterFailure', 'freeToRelease', 'freeToStop']) {
    if (now.has(free)) assert.not.ok(now.has('keep'), `${where}: the device is not freed under a keep in flight`);
  }
  if (!data.keeper) for (const id of ['keep', 'dropReleased', 'dropUnloaded']) assert.not.ok(now.has(id), `${where}: no keeper, no keeper call`);
  if (started('keep')) {
    assert.ok(after.matches({ rank: 'serving' }), `${where}: a keep starts only while the exported segments serve`);
    assert.ok(after.context.segments, `${where}: a keep has segments`);
    assert.ok(after.matches({ permission: 'allowed' }), `${where}: a keep starts only while the keeper may have them`);
    assert.not.ok(unkeepAsked, `${where}: never after an UNKEEP`);
    assert.not.ok(after.context.adopted && event !== 'KEEP_AGAIN' && event !== 'xstate.done.actor.keep' && event !== 'xstate.error.actor.keep', `${where}: an adopted shard is the keeper's already; only a returning keeper takes it again`);
  }
  // Between the keeper's take and the device's adopt, a free would run first: the adopt always settles.
  if (inFlight(before).has('adopt') && !now.has('adopt')) assert.ok(event.endsWith('.actor.adopt'), `${where}: an adopt in flight is never cut short`);
  const keeperHasIt = after.context.segments !== undefined || after.context.resident?.source.from === 'keeper';
  if (started('dropReleased')) {
    assert.ok(data.keeper && keeperHasIt, `${where}: a release drops what was kept or adopted`);
    assert.not.ok(unkeepAsked, `${where}: an UNKEEP dropped it already`);
  }
  if (started('freeToRelease') && data.keeper && keeperHasIt && !unkeepAsked) {
    assert.ok(sent.some((e) => e.endsWith('.actor.dropReleased')), `${where}: a released rank's kept copies are dropped before its memory is freed`);
  }
  // What it posted in this step.
  const failures = posted(world, postsBefore, 'FAILED');
  if (failures.length > 0) {
    assert.is(failures.length, 1, `${where}: one failure at a time`);
    if (stopAsked) assert.is(event, 'xstate.error.actor.freeToStop', `${where}: a stopped rank's load failure is not reported`);
  }
  if (posted(world, postsBefore, 'RELEASED').length > 0) assert.is(event, 'xstate.done.actor.freeToRelease', `${where}: released once freed`);
  for (const kept of posted(world, postsBefore, 'KEPT')) {
    if (kept.type === 'KEPT' && kept.kept) assert.ok(event === 'xstate.done.actor.keep' || (event === 'xstate.done.actor.export' && after.context.adopted), `${where}: kept once the keeper took it, or adopted from it`);
  }
  if (world.portClosed > 0) {
    assert.is(world.portClosed, 1, `${where}: the port closes once`);
    assert.ok(after.matches({ rank: 'stopped' }), `${where}: the port closes at the end`);
  }
  if (after.matches({ rank: 'stopped' })) assert.is(world.portClosed, 1, `${where}: a stopped rank's thread ends`);
}

for (const [name, data] of Object.entries(configs)) {
  test(`${name}: shortest paths reach every state, and each step holds the rank's rules`, () => {
    const paths = getShortestPaths(rankWorkerMachine, {
      input: { data },
      events: events as never,
      serializeState: (s: any) => JSON.stringify([s.value, s.context.adopted, s.context.segments !== undefined, s.context.resident !== undefined]),
    });
    const reached = new Set(paths.map((p) => JSON.stringify(p.state.value.rank)));
    const states = ['"admitting"', '{"adopting":"running"}', '{"adopting":"releaseAsked"}', '{"adopting":"stopAsked"}', '"allocating"', '"filling"', '"verifying"', '"exporting"', '"serving"', '"failed"', '"released"', '"stopped"'];
    for (const s of data.awaitAdmission ? states : states.filter((s) => s !== '"admitting"')) assert.ok(reached.has(s), `rank state ${s} is reachable`);
    if (data.keeper) {
      const keeperStates = new Set(paths.map((p) => JSON.stringify(p.state.value.keeper)));
      for (const s of ['"idle"', '{"keeping":"once"}', '{"keeping":"again"}', '"dropping"']) assert.ok(keeperStates.has(s), `keeper state ${s} is reachable`);
    }
    assert.ok(paths.length > 50, `walked ${paths.length} paths`);
    for (const p of paths) replay(data, p.steps.map((s) => s.event));
  });
}

/** The path to a serving rank of `data` that loaded from the checkpoint. */
const toServing = (data: RankWorkerData) => [
  done('open', fakeDevice),
  ...(data.awaitAdmission ? [{ type: 'ADMIT' }] : []),
  done('adopt', undefined),
  done('allocate'),
  done('fill', { bytes: 256, seconds: 0.2, digests: ['f'], digestRereadBytes: 0 }),
  done('verify'),
  done('export', [{ fake: 'segment' }]),
];
const kinds = (posts: RankToMain[]) => posts.filter((m) => m.type !== 'LOG').map((m) => (m.type === 'KEPT' ? `KEPT ${m.kept}${m.reason ? ` ${m.reason}` : ''}` : m.type));

const table: Array<{ what: string; data: RankWorkerData; steps: Array<{ type: string }>; posts: string[]; rank: string }> = [
  {
    what: 'an ADMIT before the device is open is remembered: the load goes on without waiting',
    data: configs.model!,
    steps: [{ type: 'ADMIT' }, ...toServing({ ...configs.model!, awaitAdmission: false })],
    posts: [],
    rank: 'serving',
  },
  {
    what: 'a KEEP before the export keeps at the export',
    data: configs.model!,
    steps: [done('open', fakeDevice), { type: 'ADMIT' }, { type: 'KEEP' }, done('adopt', undefined), done('allocate'), done('fill', { bytes: 1, seconds: 1, digests: [] }), done('verify'), done('export', []), done('keep')],
    posts: ['KEPT true'],
    rank: 'serving',
  },
  {
    what: 'a KEEP_AGAIN during a keep keeps once more after it; one before the export does nothing',
    data: configs.own!,
    steps: [{ type: 'KEEP_AGAIN' }, ...toServing(configs.own!), { type: 'KEEP_AGAIN' }, failed('keep'), done('keep')],
    posts: ['KEPT false E_KEEP happened', 'KEPT true'],
    rank: 'serving',
  },
  {
    what: 'an UNKEEP during a keep drops once the keep is done, and a release then leaves the keeper alone',
    data: configs.model!,
    steps: [...toServing(configs.model!), { type: 'KEEP' }, { type: 'UNKEEP' }, { type: 'KEEP_AGAIN' }, done('keep'), done('dropUnloaded'), { type: 'RELEASE' }, done('freeToRelease')],
    posts: ['KEPT true', 'KEPT false unloaded', 'RELEASED'],
    rank: 'released',
  },
  {
    what: 'a RELEASE during a keep waits for it, drops the kept copies, then frees',
    data: configs.own!,
    steps: [...toServing(configs.own!), { type: 'RELEASE' }, done('keep'), done('dropReleased'), done('freeToRelease'), { type: 'STOP' }, done('freeToStop')],
    posts: ['KEPT true', 'KEPT false released', 'RELEASED'],
    rank: 'stopped',
  },
  {
    what: 'a RELEASE during an adopt waits for it, drops the shard it took from the keeper, then frees',
    data: configs.own!,
    steps: [done('open', fakeDevice), { type: 'RELEASE' }, done('adopt', adopted(false)), done('dropReleased'), done('freeToRelease')],
    posts: ['KEPT false released', 'RELEASED'],
    rank: 'released',
  },
  {
    what: 'a RELEASE during an adopt that took nothing frees once it is done, and a STOP during one frees without a drop',
    data: configs.own!,
    steps: [done('open', fakeDevice), { type: 'RELEASE' }, done('adopt', undefined), done('freeToRelease'), { type: 'STOP' }, done('freeToStop')],
    posts: ['RELEASED'],
    rank: 'stopped',
  },
  {
    what: 'a STOP during an adopt waits for it and frees without dropping what it took',
    data: configs.own!,
    steps: [done('open', fakeDevice), { type: 'RELEASE' }, { type: 'STOP' }, done('adopt', adopted(false)), done('freeToStop')],
    posts: [],
    rank: 'stopped',
  },
  {
    what: 'an adopted shard is reported kept at once and not kept again on KEEP, but is on KEEP_AGAIN',
    data: configs.model!,
    steps: [done('open', fakeDevice), { type: 'ADMIT' }, done('adopt', adopted(false)), done('verify'), done('export', []), { type: 'KEEP' }, { type: 'KEEP_AGAIN' }, done('keep')],
    posts: ['KEPT true', 'KEPT true'],
    rank: 'serving',
  },
  {
    what: 'a STOP during the fill cancels it, and its failure is not reported',
    data: configs.own!,
    steps: [done('open', fakeDevice), done('adopt', undefined), done('allocate'), { type: 'STOP' }, done('freeToStop')],
    posts: [],
    rank: 'stopped',
  },
  {
    what: 'a failed phase frees the device, reports once, and a STOP then ends the thread',
    data: configs.noKeeper!,
    steps: [done('open', fakeDevice), { type: 'ADMIT' }, failed('adopt'), done('freeAfterFailure'), { type: 'STOP' }, done('freeToStop')],
    posts: ['FAILED'],
    rank: 'stopped',
  },
];

for (const row of table) {
  test(`table: ${row.what}`, () => {
    const { world, last } = replay(row.data, row.steps);
    assert.equal(kinds(world.posts), row.posts);
    assert.is(JSON.stringify(last.value.rank), JSON.stringify(row.rank));
  });
}

test('a STOP or RELEASE cancels a fill in progress', () => {
  for (const type of ['STOP', 'RELEASE']) {
    const { world } = replay(configs.own!, [done('open', fakeDevice), done('adopt', undefined), done('allocate'), { type }]);
    assert.is(world.cancels, 1, type);
  }
});

test.run();
