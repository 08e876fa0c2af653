// Model-based test of the node's first model (the one its group forms around) as a model actor:
// the model machine walked with ModelJoin FORMS_GROUP, spanning a group of two nodes and with a
// keeper, every path replayed against fake rank, serve, files-check and keeper-drop actors. What
// must hold on every path: its ranks never wait for an admission nor a KEEP (they allocate at
// once and keep once exported, as they always did), it never waits for node 0's commit (the
// rendezvous formed its group), and a failure leaves the keeper's copies for the next start.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback, fromPromise } from 'xstate';
import { getShortestPaths, getSimplePaths } from 'xstate/graph';
import type { FileIdentity } from '../../src/files/fileIdentity.js';
import type { PlannedModel } from '../../src/models/planModel.js';
import type { RankActorInput, RankCommand, RankEvent } from '../../src/models/rankContract.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import type { RankServiceInput, ServeCommand, ServeEvent } from '../../src/serve/serveEvents.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import { FORMS_GROUP, modelMachine, type ModelInput } from '../../src/models/modelMachine.js';
import type { DropModelShardsInput } from '../../src/models/dropModelShards.js';

const RANKS = 2;
const err = { name: 'DeviceError', code: 'E_TEST', message: 'boom' };
const device = (r: number) => ({ backend: 'host', index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });

/** The group's model at tp 4 over 2 nodes, as node 1 plans it: its local ranks are global ranks 2 and 3. */
const planned = {
  spec: { name: 'model', modelDir: '/fake/model', tpSize: 2 * RANKS, layouts: ['checkpoint'] },
  plan: {
    modelDir: '/fake/model', architecture: 'LlamaForCausalLM', tpSize: 2 * RANKS, fingerprint: 'f'.repeat(64), fingerprintFields: {}, layouts: ['checkpoint'],
    ranks: Array.from({ length: 2 * RANKS }, (_, r) => ({ tpRank: r, tpSize: 2 * RANKS, files: [], segments: [256], tensors: [], aliases: {}, ops: [], layouts: {}, zeroRanges: [], totalBytes: 256, fingerprint: `rank${r}`, contentTensors: { names: [], ranges: [] } })),
    files: [],
  },
  placement: { nodeRank: 1, nnodes: 2, localWorldSize: RANKS },
  devices: Array.from({ length: RANKS }, (_, i) => ({ backend: 'host' as const, index: i, uuid: `fake-${i}` })),
  fill: {},
} as unknown as PlannedModel;

class World {
  ranks = new Set<number>();
  rankCommands: RankCommand[] = [];
  servers = new Set<number>();
  keptDrops = 0;
  implementations() {
    return {
      actors: {
        rank: fromCallback<RankCommand, RankActorInput, RankEvent>(({ input, receive }) => {
          const r = input.workerData.localRank;
          assert.is(input.workerData.awaitAdmission, false, 'its ranks allocate once their device is open');
          assert.is(input.workerData.keepOnceServing, false, 'its ranks keep once exported');
          this.ranks.add(r);
          receive((cmd) => this.rankCommands.push(cmd));
          return () => this.ranks.delete(r);
        }),
        rankService: fromCallback<ServeCommand, RankServiceInput, ServeEvent>(({ input }) => {
          const r = input.rank.localRank;
          this.servers.add(r);
          return () => this.servers.delete(r);
        }),
        checkFiles: fromPromise<void, { files: FileIdentity[] }>(() => new Promise<void>(() => {})),
        dropModelShards: fromPromise<void, DropModelShardsInput>(() => {
          this.keptDrops++;
          return new Promise<void>(() => {});
        }),
      },
    };
  }
}

const ranks = [...Array(RANKS).keys()];
const events = [
  { type: 'MODEL_UNLOAD', force: false },
  { type: 'MODEL_STOP' },
  { type: 'xstate.done.actor.checkFiles' },
  { type: 'xstate.error.actor.checkFiles', error: { name: 'CheckpointError', code: 'E_FILE_CHANGED', message: 'changed' } },
  ...ranks.flatMap((r) => [
    { type: 'RANK_DEVICE', localRank: r, info: device(r) },
    { type: 'RANK_LOADED', localRank: r, device: device(r), segments: [], bytes: 256, seconds: 0.1, source: { from: 'checkpoint' } },
    { type: 'RANK_SERVING', localRank: r, socketPath: `/fake/fake-${r}.sock` },
    { type: 'RANK_RELEASE_REQUESTED', localRank: r },
    { type: 'RANK_RELEASED', localRank: r },
    { type: 'RANK_STOPPED', localRank: r },
    { type: 'RANK_FAILED', localRank: r, error: err },
  ]),
];

const nobody = createActor(fromCallback(() => {})).start();
const input: ModelInput = {
  id: 'model-0', parent: nobody, planned, startup: true, join: FORMS_GROUP, socketDir: '/fake', cudaHandles: 'ipc', log: pino({ level: 'silent' }),
  keeper: { socket: '/fake/keeper.sock', model: '/fake/model', writer: 'weightd test' },
  rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry(),
};
const options = {
  input,
  events: events as never[],
  serializeState: (s: any) => JSON.stringify([s.value, s.context.ranks.map((r: any) => [r.state, r.device !== undefined])]),
};

function replay(steps: Array<{ event: { type: string } }>) {
  const world = new World();
  const told: string[] = [];
  const parent = createActor(fromCallback(({ receive }) => receive((e: { type: string }) => told.push(e.type)))).start();
  const actor = createActor(modelMachine.provide(world.implementations()), { input: { ...input, parent } });
  const errors: unknown[] = [];
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  for (const step of steps) {
    if (step.event.type === 'xstate.init') continue;
    if (actor.getSnapshot().status !== 'active') break;
    actor.send(step.event as never);
    const snap = actor.getSnapshot();
    const state = String(snap.value);
    const where = `${state} after ${step.event.type}`;
    assert.not.ok(['admitting', 'resident', 'failing'].includes(state), `${where}: no admission, no commit round, no drop of the keeper's copies`);
    if (['loading', 'verifying'].includes(state)) assert.is(world.servers.size, 0, `${where}: no socket before the files are checked`);
    if (state === 'serving') assert.ok(told.includes('MODEL_SERVING'), `${where}: the supervisor was told`);
    if (state === 'starting') assert.ok(told.includes('MODEL_STARTING'), `${where}: the node hears its sockets are being bound`);
    if (snap.status === 'done') {
      assert.is(world.ranks.size + world.servers.size, 0, `${where}: every child is gone`);
      assert.ok(told.includes(state === 'failed' ? 'MODEL_FAILED' : 'MODEL_GONE'), `${where}: the supervisor was told`);
    }
  }
  assert.equal(errors, [], 'the machine raised no error');
  assert.not.ok(world.rankCommands.some((c) => c.type === 'RANK_ADMIT' || c.type === 'RANK_KEEP'), 'no rank was told to wait for admission or for KEEP');
  assert.is(world.keptDrops, 0, "the keeper's copies are left for the next start");
  actor.stop();
  parent.stop();
}

test("the node's first model: shortest paths reach serving and the ends, never admitting, resident or failing", () => {
  const paths = getShortestPaths(modelMachine, options);
  const reached = new Set(paths.map((p) => String(p.state.value)));
  for (const s of ['loading', 'verifying', 'starting', 'serving', 'draining', 'released', 'stopping', 'stopped', 'failed']) assert.ok(reached.has(s), `state ${s} is reachable`);
  for (const s of ['admitting', 'resident', 'failing']) assert.not.ok(reached.has(s), `state ${s} is not`);
  for (const p of paths) replay(p.steps as any);
});

test("the node's first model: every simple path to an end tears everything down and tells the supervisor", () => {
  const paths = getSimplePaths(modelMachine, { ...options, toState: (s: any) => s.status === 'done' });
  assert.ok(paths.length > 10, `enumerated ${paths.length} paths`);
  for (const p of paths) replay(p.steps as any);
});

test.after(() => {
  nobody.stop();
});

test.run();
