// Model-based test of a model's lifecycle (src/models/modelMachine.ts): xstate/graph enumerates the
// paths through the machine with every event it can receive, and each path is replayed against a
// live actor with fake rank, serve and checkFiles actors, checking at every step what must hold
// in that state: nothing allocated before the fit check, no socket before the files are checked,
// servers gone before memory is freed, nothing left once it ends. A model that spans the group
// is walked too: it is served only after node 0's commit, and an abort frees it in any state.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback, fromPromise } from 'xstate';
import { getShortestPaths, getSimplePaths } from 'xstate/graph';
import type { FileIdentity } from '../../src/files/fileIdentity.js';
import type { PlannedModel } from '../../src/models/planModel.js';
import type { RankActorInput, RankCommand } from '../../src/models/rankContract.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import type { RankServiceInput } from '../../src/serve/serveEvents.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import type { RankEvent } from '../../src/models/rankContract.js';
import { modelMachine, type ModelInput } from '../../src/models/modelMachine.js';
import type { ServeCommand, ServeEvent } from '../../src/serve/serveEvents.js';

const RANKS = 2;
const err = { name: 'DeviceError', code: 'E_TEST', message: 'boom' };
const device = (r: number, freeBytes: number) => ({ backend: 'host', index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes });

const planned = {
  spec: { name: 'draft', modelDir: '/fake/draft', tpSize: RANKS, layouts: ['checkpoint'] },
  plan: {
    modelDir: '/fake/draft', architecture: 'LlamaForCausalLM', tpSize: RANKS, fingerprint: 'd'.repeat(64), fingerprintFields: {}, layouts: ['checkpoint'],
    ranks: Array.from({ length: RANKS }, (_, r) => ({ tpRank: r, tpSize: RANKS, files: [], segments: [256], tensors: [], aliases: {}, ops: [], layouts: {}, zeroRanges: [], totalBytes: 256, fingerprint: `draft${r}`, contentTensors: { names: [], ranges: [] } })),
    files: [],
  },
  placement: { nodeRank: 0, nnodes: 1, localWorldSize: RANKS },
  devices: Array.from({ length: RANKS }, (_, i) => ({ backend: 'host' as const, index: i, uuid: `fake-${i}` })),
  fill: {},
} as unknown as PlannedModel;

/** The same model at tp 4 over 2 nodes, as node 1 plans it: its local ranks are global ranks 2 and 3. */
const spanning = {
  ...planned,
  spec: { ...planned.spec, tpSize: 2 * RANKS },
  plan: { ...planned.plan, tpSize: 2 * RANKS, ranks: Array.from({ length: 2 * RANKS }, (_, r) => ({ ...planned.plan.ranks[0]!, tpRank: r, fingerprint: `draft${r}` })) },
  placement: { nodeRank: 1, nnodes: 2, localWorldSize: RANKS },
} as unknown as PlannedModel;

/** Records what the machine did to its children. */
class World {
  ranks = new Set<number>();
  rankCommands: Array<{ localRank: number; cmd: RankCommand }> = [];
  servers = new Set<number>();
  serveCommands: Array<{ localRank: number; cmd: ServeCommand }> = [];
  checking = false;
  toParent: string[] = [];
  implementations() {
    return {
      actors: {
        rank: fromCallback<RankCommand, RankActorInput, RankEvent>(({ input, receive }) => {
          const r = input.workerData.localRank;
          assert.ok(input.workerData.awaitAdmission, 'a model beside the node waits for admission before it allocates');
          this.ranks.add(r);
          receive((cmd) => this.rankCommands.push({ localRank: r, cmd }));
          return () => this.ranks.delete(r);
        }),
        rankService: fromCallback<ServeCommand, RankServiceInput, ServeEvent>(({ input, receive }) => {
          const r = input.rank.localRank;
          this.servers.add(r);
          receive((cmd) => this.serveCommands.push({ localRank: r, cmd }));
          return () => this.servers.delete(r);
        }),
        // Settles only when the test sends its done/error event.
        checkFiles: fromPromise<void, { files: FileIdentity[] }>(() => {
          this.checking = true;
          return new Promise<void>(() => {});
        }),
      },
    };
  }
}

const ranks = [...Array(RANKS).keys()];
const events = [
  { type: 'MODEL_UNLOAD', force: false },
  { type: 'MODEL_UNLOAD', force: true },
  { type: 'MODEL_STOP' },
  { type: 'xstate.done.actor.checkFiles' },
  { type: 'xstate.error.actor.checkFiles', error: { name: 'CheckpointError', code: 'E_FILE_CHANGED', message: 'changed' } },
  ...ranks.flatMap((r) => [
    { type: 'RANK_DEVICE', localRank: r, info: device(r, 1 << 20) },
    { type: 'RANK_LOADED', localRank: r, device: device(r, 1 << 20), segments: [], bytes: 256, seconds: 0.1, source: { from: 'checkpoint' } },
    { type: 'RANK_SERVING', localRank: r, socketPath: `/fake/fake-${r}.sock` },
    { type: 'RANK_RELEASE_REQUESTED', localRank: r },
    { type: 'RANK_RELEASED', localRank: r },
    { type: 'RANK_STOPPED', localRank: r },
    { type: 'RANK_FAILED', localRank: r, error: err },
  ]),
];

/** Node 0's verdicts, which only a model that spans the group hears (the supervisor sends them to no other). */
const groupEvents = [
  { type: 'MODEL_COMMIT' },
  { type: 'MODEL_ABORT', error: { name: 'RendezvousError', code: 'E_MODEL_GROUP_PEER_FAILED', message: 'node 0 failed it' } },
];

/** Stands in for the supervisor while xstate/graph walks the machine alone. */
const nobody = createActor(fromCallback(() => {})).start();

const input: ModelInput = {
  id: 'model-0', parent: nobody, planned, startup: false, socketDir: '/fake', cudaHandles: 'ipc', log: pino({ level: 'silent' }),
  rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry(),
};

const options = {
  input,
  events: events as never[],
  serializeState: (s: any) => JSON.stringify([s.value, s.context.ranks.map((r: any) => [r.state, r.device !== undefined]), s.context.force]),
};

/** The model machine as the supervisor runs it, its parent a recorder of what it is told. */
function replay(steps: Array<{ event: { type: string } }>, model: PlannedModel = planned) {
  const world = new World();
  const told: string[] = [];
  const parent = createActor(fromCallback(({ receive }) => receive((e: { type: string }) => told.push(e.type)))).start();
  const actor = createActor(modelMachine.provide(world.implementations()), { input: { ...input, planned: model, parent } });
  const errors: unknown[] = [];
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  for (const step of steps) {
    if (step.event.type === 'xstate.init') continue;
    const before = String(actor.getSnapshot().value);
    if (actor.getSnapshot().status !== 'active') break;
    actor.send(step.event as never);
    check(actor.getSnapshot(), world, told, step.event.type, before);
  }
  assert.equal(errors, [], 'the machine raised no error');
  const last = actor.getSnapshot();
  actor.stop();
  parent.stop();
  return { world, told, last };
}

function check(snap: any, world: World, told: string[], event: string, from: string) {
  const state = String(snap.value);
  const where = `${state} after ${event} (from ${from})`;
  if (state === 'admitting') {
    assert.equal([...world.ranks].sort(), ranks, `${where}: every rank opens its device`);
    assert.not.ok(world.rankCommands.some((c) => c.cmd.type === 'RANK_ADMIT'), `${where}: nothing is admitted before every rank reported its memory`);
  }
  if (state === 'loading') assert.is(world.rankCommands.filter((c) => c.cmd.type === 'RANK_ADMIT').length, RANKS, `${where}: every rank admitted once`);
  if (['admitting', 'loading', 'verifying', 'resident'].includes(state)) assert.is(world.servers.size, 0, `${where}: no socket before the files are checked (and node 0 committed)`);
  if (state === 'resident') assert.ok(told.includes('MODEL_RESIDENT'), `${where}: the supervisor hears it is resident`);
  if (['starting', 'serving'].includes(state) && snap.context.planned.placement.nnodes > 1) assert.ok(event === 'MODEL_COMMIT' || from !== 'resident', `${where}: served only after the commit`);
  if (state === 'serving') {
    const globals = snap.context.ranks.map((r: any) => r.globalRank);
    const p = snap.context.planned.placement;
    assert.equal(globals, ranks.map((r) => p.nodeRank * p.localWorldSize + r), `${where}: this node's global ranks`);
  }
  if (state === 'serving') {
    assert.equal([...world.servers].sort(), ranks, `${where}: every rank is served`);
    assert.ok(told.includes('MODEL_SERVING'), `${where}: the supervisor was told`);
    assert.is(world.serveCommands.filter((c) => c.cmd.type === 'SERVE_ANNOUNCE').length, RANKS, `${where}: watchers hear it on every rank`);
  }
  if (state === 'draining') {
    for (const r of ranks) assert.ok(world.serveCommands.some((c) => c.localRank === r && c.cmd.type === 'SERVE_DRAIN'), `${where}: rank ${r} drains`);
  }
  if (state === 'stopping') assert.is(world.servers.size, 0, `${where}: servers stop before memory is freed`);
  if (snap.status === 'done') {
    assert.ok(['released', 'stopped', 'failed'].includes(state), `${where}: a final state`);
    assert.is(world.ranks.size + world.servers.size, 0, `${where}: every child is gone`);
    assert.ok(told.includes(state === 'failed' ? 'MODEL_FAILED' : 'MODEL_GONE'), `${where}: the supervisor was told`);
  }
  if (state === 'failed') assert.ok(snap.context.failure?.message, `${where}: the failure is recorded`);
}

test('shortest paths reach every state, and each state holds its invariants', () => {
  const paths = getShortestPaths(modelMachine, options);
  const reached = new Set(paths.map((p) => String(p.state.value)));
  for (const s of ['admitting', 'loading', 'verifying', 'starting', 'serving', 'draining', 'released', 'stopping', 'stopped', 'failed']) {
    assert.ok(reached.has(s), `state ${s} is reachable`);
  }
  for (const p of paths) replay(p.steps as any);
});

test('every simple path to an end tears everything down and tells the supervisor', () => {
  const paths = getSimplePaths(modelMachine, { ...options, toState: (s: any) => s.status === 'done' });
  assert.ok(paths.length > 20, `enumerated ${paths.length} paths`);
  for (const p of paths) replay(p.steps as any);
});

test('a model that spans the group: paths reach resident, and it serves only after the commit; an abort frees it anywhere before', () => {
  const paths = getShortestPaths(modelMachine, { ...options, events: [...events, ...groupEvents] as never[], input: { ...input, planned: spanning } });
  const reached = new Set(paths.map((p) => String(p.state.value)));
  for (const s of ['admitting', 'loading', 'verifying', 'resident', 'starting', 'serving', 'failed']) assert.ok(reached.has(s), `state ${s} is reachable`);
  for (const p of paths) replay(p.steps as any, spanning);
  // An abort after resident: failed, every rank freed, the failure is the group's verdict.
  const r = ranks.flatMap((l) => [{ type: 'RANK_DEVICE', localRank: l, info: device(l, 1 << 20) }]);
  const loaded = ranks.map((l) => ({ type: 'RANK_LOADED', localRank: l, device: device(l, 1 << 20), segments: [], bytes: 256, seconds: 0.1, source: { from: 'checkpoint' } }));
  const steps = [...r, ...loaded, { type: 'xstate.done.actor.checkFiles' }, { type: 'MODEL_ABORT', error: { name: 'RendezvousError', code: 'E_MODEL_GROUP_PEER_FAILED', message: 'node 0 failed it' } }];
  const { world, told, last } = replay(steps.map((event) => ({ event })) as never, spanning);
  assert.is(last.value, 'failed');
  assert.is(last.context.failure?.code, 'E_MODEL_GROUP_PEER_FAILED');
  assert.equal(told, ['MODEL_RESIDENT', 'MODEL_FAILED']);
  assert.is(world.ranks.size + world.servers.size, 0, 'every rank freed, no server ever started');
});

test('ranks that do not fit are refused before any is admitted, naming the bytes', () => {
  const { world, told, last: snap } = replay([
    { event: { type: 'RANK_DEVICE', localRank: 0, info: device(0, 300) } as never },
    { event: { type: 'RANK_DEVICE', localRank: 1, info: device(1, 300) } as never },
  ]);
  assert.is(snap.value, 'failed');
  assert.ok(told.includes('MODEL_FAILED'));
  assert.is(snap.context.failure?.code, 'E_DOES_NOT_FIT');
  assert.match(snap.context.failure!.message, /need 512 bytes .* of host memory, which has 300 bytes .* free; nothing was allocated/);
  assert.equal(world.rankCommands, [], 'no rank was admitted');
  assert.is(world.ranks.size, 0, 'every rank thread is gone');
});

test.after(() => {
  nobody.stop();
});

test.run();
