// A version a writer committed, served with a keeper, is kept before it is announced
// (src/models/modelMachine.ts, keptBeforeServing): no file holds its bytes, so a commit answered
// before the keeper holds them would be lost with the daemon. The model machine with fake ranks and
// servers: it stays starting, with no announcement, until every rank's keep is reported, and a
// failed keep fails it (E_VERSION_NOT_KEPT) without ever announcing it. A checkpoint's version
// is served as before, kept once it serves. Whoever follows the actor hears each rank's keep.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback, fromPromise } from 'xstate';
import type { PlannedModel } from '../../src/models/planModel.js';
import type { RankActorInput, RankCommand, RankEvent } from '../../src/models/rankContract.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import type { RankServiceInput, ServeCommand, ServeEvent } from '../../src/serve/serveEvents.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import { modelMachine, type ModelEmitted, type ModelInput } from '../../src/models/modelMachine.js';
import type { DropModelShardsInput } from '../../src/models/dropModelShards.js';

const RANKS = 2;
const ranks = [...Array(RANKS).keys()];
const device = (r: number) => ({ backend: 'host', index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 20 });

const checkpoint = {
  spec: { name: 'w', modelDir: '/fake/w', tpSize: RANKS, layouts: ['checkpoint'] },
  plan: {
    modelDir: '/fake/w', architecture: 'LlamaForCausalLM', tpSize: RANKS, fingerprint: 'd'.repeat(64), fingerprintFields: {}, layouts: ['checkpoint'],
    ranks: ranks.map((r) => ({ tpRank: r, tpSize: RANKS, files: [], segments: [256], tensors: [], aliases: {}, ops: [], layouts: {}, zeroRanges: [], totalBytes: 256, fingerprint: `w${r}`, contentTensors: { names: [], ranges: [] } })),
    files: [],
  },
  placement: { nodeRank: 0, nnodes: 1, localWorldSize: RANKS },
  devices: ranks.map((i) => ({ backend: 'host' as const, index: i, uuid: `fake-${i}` })),
  fill: {},
  origin: 'load',
} as unknown as PlannedModel;
const written = { ...checkpoint, origin: 'update', version: 3, base: 'd'.repeat(64), currentSince: 1 } as unknown as PlannedModel;

function run(planned: PlannedModel) {
  const rankCommands: string[] = [];
  const serveCommands: string[] = [];
  const dropped: string[] = [];
  const implementations = {
    actors: {
      rank: fromCallback<RankCommand, RankActorInput, RankEvent>(({ input, receive }) => receive((cmd) => rankCommands.push(`${cmd.type} ${input.workerData.localRank}`))),
      rankService: fromCallback<ServeCommand, RankServiceInput, ServeEvent>(({ input, receive }) => receive((cmd) => serveCommands.push(`${cmd.type} ${input.rank.localRank}`))),
      checkFiles: fromPromise<void, { files: unknown[] }>(async () => {}),
      dropModelShards: fromPromise<void, DropModelShardsInput>(async ({ input }) => void dropped.push(input.planned.plan.fingerprint)),
    },
  };
  const nobody = createActor(fromCallback(() => {})).start();
  const input: ModelInput = {
    id: 'model-1', parent: nobody, planned, startup: false, socketDir: '/fake', cudaHandles: 'ipc', log: pino({ level: 'silent' }),
    rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry(),
    keeper: { socket: '/fake/keeper.sock', model: '/fake/w', writer: 'weightd test' },
  };
  const actor = createActor(modelMachine.provide(implementations as never), { input });
  const heard: ModelEmitted[] = [];
  actor.on('RANK_KEPT', (e) => heard.push(e));
  actor.start();
  const send = (e: object) => actor.send(e as never);
  return { actor, send, rankCommands, serveCommands, dropped, heard };
}

/** Every rank opened, loaded (adopted the writer's segments), its files checked, and served on its socket. */
async function toServed(send: (e: object) => void) {
  for (const r of ranks) send({ type: 'RANK_DEVICE', localRank: r, info: device(r) });
  for (const r of ranks) send({ type: 'RANK_LOADED', localRank: r, device: device(r), segments: [], bytes: 256, seconds: 0.1, source: { from: 'writer' }, digests: [] });
  await new Promise((resolve) => setImmediate(resolve));
  for (const r of ranks) send({ type: 'RANK_SERVING', localRank: r, socketPath: `/fake/${r}.sock` });
}

test('a written version is announced only once every rank is kept, and kept once', async () => {
  const m = run(written);
  await toServed(m.send);
  assert.is(m.actor.getSnapshot().value, 'starting', 'served on its sockets, not announced');
  assert.equal(m.rankCommands.filter((c) => c.startsWith('RANK_KEEP ')), ['RANK_KEEP 0', 'RANK_KEEP 1']);
  m.send({ type: 'RANK_KEPT', localRank: 0, kept: true, currentSince: 1 });
  assert.is(m.actor.getSnapshot().value, 'starting');
  assert.not.ok(m.serveCommands.some((c) => c.startsWith('SERVE_ANNOUNCE')), 'not announced before every rank is kept');
  m.send({ type: 'RANK_KEPT', localRank: 1, kept: true, currentSince: 1 });
  assert.is(m.actor.getSnapshot().value, 'serving');
  assert.equal(m.serveCommands.filter((c) => c.startsWith('SERVE_ANNOUNCE')), ['SERVE_ANNOUNCE 0', 'SERVE_ANNOUNCE 1']);
  assert.is(m.rankCommands.filter((c) => c.startsWith('RANK_KEEP ')).length, RANKS, 'no second keep once it serves');
  assert.equal(m.heard.map((e) => [e.localRank, e.kept, e.currentSince]), [[0, true, 1], [1, true, 1]], "whoever follows it hears each rank's keep");
  m.actor.stop();
});

test("a written version a rank's keep failed for is never announced, fails with E_VERSION_NOT_KEPT, and what was kept of it is dropped", async () => {
  const m = run(written);
  await toServed(m.send);
  m.send({ type: 'RANK_KEPT', localRank: 0, kept: true, currentSince: 1 });
  m.send({ type: 'RANK_KEPT', localRank: 1, kept: false, reason: 'connect ECONNREFUSED /fake/keeper.sock', currentSince: 1 });
  await new Promise((resolve) => setImmediate(resolve));
  const snap = m.actor.getSnapshot();
  assert.is(snap.value, 'failed');
  assert.is(snap.context.failure?.code, 'E_VERSION_NOT_KEPT');
  assert.match(snap.context.failure!.message, /version 3 was not served: the keeper did not keep rank 1's shard \(connect ECONNREFUSED/);
  assert.equal(m.dropped, [written.plan.fingerprint]);
  assert.not.ok(m.serveCommands.some((c) => c.startsWith('SERVE_ANNOUNCE')), 'never announced');
});

test("a checkpoint's version serves once its ranks do, and is kept after", async () => {
  const m = run(checkpoint);
  await toServed(m.send);
  assert.is(m.actor.getSnapshot().value, 'serving');
  assert.equal(m.rankCommands.filter((c) => c.startsWith('RANK_KEEP ')), ['RANK_KEEP 0', 'RANK_KEEP 1']);
  m.actor.stop();
});

test.run();
