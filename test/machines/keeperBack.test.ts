// A returning keeper goes through the machines, as every other event does: the supervisor hears
// KEEPER_BACK and tells each model it serves (its first included), and a model tells its ranks; each
// rank then decides whether the keeper may have its segments (src/machines/rankWorkerMachine.ts).
// A model loaded at run time is the child its MODEL_LOAD names, so node.load follows that one.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback, type AnyActorRef } from 'xstate';
import pino from 'pino';
import type { PlannedModel } from '../../src/models/planModel.js';
import type { RankActorInput, RankCommand, RankEvent } from '../../src/models/rankContract.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import type { SupervisorEvent } from '../../src/machines/events.js';
import { modelMachine, type ModelCommand } from '../../src/models/modelMachine.js';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { MODEL_REGISTRY_ID, modelActor, modelEntries, type ModelEvent } from '../../src/models/modelHost.js';
import { modelRegistryMachine } from '../../src/models/modelRegistryMachine.js';
import { FakeWorld, fakeInput, fakePlanned, fakePrepared, fakeRankTable, LOCAL_RANKS } from '../helpers/fakeNode.js';
import { modelActorId } from '../../src/models/modelHost.js';

const ranks = [...Array(LOCAL_RANKS).keys()];
const fakeDevice = (r: number) => ({ backend: 'host', index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });
const planned = {
  spec: { name: 'draft', modelDir: '/fake/draft', tpSize: LOCAL_RANKS, layouts: ['checkpoint'] },
  plan: { fingerprint: 'd'.repeat(64), ranks: fakePlanned.plan.ranks, files: [] },
  placement: { nodeRank: 0, nnodes: 1, localWorldSize: LOCAL_RANKS },
  devices: fakePrepared.devices,
  fill: {},
} as unknown as PlannedModel;

/** A node driven to ready with fake actors, whose model actors record what they are told. */
function readyNode() {
  const world = new FakeWorld();
  const told: Array<{ id: string; cmd: ModelCommand }> = [];
  const implementations = world.implementations();
  const model = fromCallback<ModelCommand, { id: string }>(({ input, receive }) => receive((cmd) => told.push({ id: input.id, cmd })));
  const actor = createActor(supervisorMachine.provide({ actors: { ...implementations.actors, modelRegistry: modelRegistryMachine.provide({ actors: { model: model as never } }) } }), { input: fakeInput() });
  actor.start();
  const send = (e: unknown) => actor.send(e as SupervisorEvent);
  send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
  // Before the models exist, a returning keeper has nobody to tell.
  send({ type: 'KEEPER_BACK' });
  assert.equal(told, []);
  send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
  const first = modelActorId(0);
  // What the first model's actor tells the registry.
  const tell = (e: ModelEvent) => (actor.getSnapshot().children[MODEL_REGISTRY_ID] as AnyActorRef).send(e);
  tell({ type: 'MODEL_STARTING', id: first });
  tell({ type: 'MODEL_SERVING', id: first, entries: ranks.map((r) => ({ globalRank: r, localRank: r, socketPath: `/s/${r}`, deviceUuid: fakeDevice(r).uuid, fingerprint: `rank${r}` })) });
  assert.is(actor.getSnapshot().value, 'ready');
  return { world, told, actor, send };
}

test('a model loaded at run time is the child named by its MODEL_LOAD', () => {
  const { actor, send } = readyNode();
  send({ type: 'MODEL_LOAD', id: 'load-7', planned });
  const child = modelActor(actor.getSnapshot(), 'load-7');
  assert.ok(child, 'found by the id the load gave it');
  assert.is(child!.id, 'load-7');
  assert.equal(modelEntries(actor.getSnapshot()).map((m) => m.id), [modelActorId(0), 'load-7']);
  actor.stop();
});

test("KEEPER_BACK reaches every model the node serves, its first included", () => {
  const { told, actor, send } = readyNode();
  send({ type: 'MODEL_LOAD', id: 'load-1', planned });
  send({ type: 'KEEPER_BACK' });
  assert.equal(told, [{ id: modelActorId(0), cmd: { type: 'KEEPER_BACK' } }, { id: 'load-1', cmd: { type: 'KEEPER_BACK' } }]);
  actor.stop();
});

test("a model passes KEEPER_BACK to each of its ranks, from admission on", () => {
  const commands: Array<{ localRank: number; cmd: RankCommand }> = [];
  const rank = fromCallback<RankCommand, RankActorInput, RankEvent>(({ input, receive }) => receive((cmd) => commands.push({ localRank: input.workerData.localRank, cmd })));
  const nobody = createActor(fromCallback(() => {})).start();
  const actor = createActor(modelMachine.provide({ actors: { rank } }), {
    input: {
      id: 'load-1', parent: nobody, planned, startup: false, socketDir: '/fake', cudaHandles: 'ipc', log: pino({ level: 'silent' }),
      rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry(),
    },
  });
  actor.start();
  assert.is(actor.getSnapshot().value, 'admitting');
  actor.send({ type: 'KEEPER_BACK' });
  assert.equal(commands, ranks.map((localRank) => ({ localRank, cmd: { type: 'RANK_KEEP_AGAIN' } })));
  actor.stop();
  nobody.stop();
});

test.run();
