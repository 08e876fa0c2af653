// Model-based test of the model registry (src/models/modelRegistryMachine.ts) alone: xstate/graph
// enumerates the paths through it with every event its models and the node send it, and each path
// is replayed against a live actor whose model actors are fakes, checking at every step what must
// hold: a live actor for each listed model and none other, the node told it is ready once every
// startup model serves and failed only by a model whose failure fails it, older versions of a name
// drained once a newer one serves, every model told to stop, nothing left once it ends.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback } from 'xstate';
import { getShortestPaths } from 'xstate/graph';
import type { ModelCommand, ModelInput } from '../../src/models/modelMachine.js';
import { FORMS_GROUP, LOADED_BESIDE } from '../../src/models/modelMachine.js';
import type { ModelEntry, ModelRegistryReport } from '../../src/models/modelHost.js';
import { modelRegistryMachine, type ModelRegistryInput } from '../../src/models/modelRegistryMachine.js';
import type { PlannedModel } from '../../src/models/planModel.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import { fakePlanned } from '../helpers/fakeNode.js';

const err = { name: 'DeviceError', code: 'E_TEST', message: 'boom' };
/** A second model the node starts with, restored from the keeper: its failure fails it alone. */
const restored = { ...fakePlanned, spec: { ...fakePlanned.spec, name: 'draft' }, plan: { ...fakePlanned.plan, fingerprint: 'draft' }, origin: 'restore' } as PlannedModel;
/** A newer version of the node's first model, loaded at run time. */
const newer = { ...fakePlanned, plan: { ...fakePlanned.plan, fingerprint: 'newer' }, origin: 'load' } as PlannedModel;
const entries = (id: string) => [{ globalRank: 0, localRank: 0, socketPath: `/fake/${id}.sock`, deviceUuid: 'fake-0', fingerprint: id }];
const serving = (id: string) => ({ type: 'MODEL_SERVING', id, entries: entries(id), digests: [`digest-${id}`] });

const events = [
  { type: 'MODEL_STARTING', id: 'model-0' },
  serving('model-0'),
  serving('model-1'),
  { type: 'MODEL_FAILED', id: 'model-0', error: err },
  { type: 'MODEL_FAILED', id: 'model-1', error: err },
  { type: 'MODEL_GONE', id: 'model-0' },
  { type: 'MODEL_GONE', id: 'model-1' },
  { type: 'MODEL_STALE', id: 'model-1', spec: restored.spec, changes: [], described: 'x changed' },
  // A load is walked in the test below: the same MODEL_LOAD again would spawn a second actor of one id, which node.load never sends.
  { type: 'MODEL_UNLOAD', ids: ['model-1'], force: false },
  { type: 'KEEPER_BACK' },
  { type: 'MODELS_STOP' },
  { type: 'MODELS_HALT' },
  { type: 'xstate.after.stopTimeout.modelRegistry.stopping' },
];

/** Stands in for the supervisor while xstate/graph walks the machine alone. */
const nobody = createActor(fromCallback(() => {})).start();

const input: ModelRegistryInput = {
  node: nobody, startup: [fakePlanned, restored], socketDir: '/fake', cudaHandles: 'ipc', log: pino({ level: 'silent' }),
  rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry(),
};

const options = {
  input,
  events: events as never[],
  serializeState: (s: any) => JSON.stringify([s.value, s.context.models.map((m: ModelEntry) => [m.id, m.entries !== undefined, m.gone ?? false, m.unloaded])]),
};

/** The registry as the supervisor runs it: fake model actors, and the node a recorder of its reports. */
function replay(steps: Array<{ event: { type: string } }>) {
  const live = new Map<string, ModelInput>();
  const told: Array<{ id: string; cmd: ModelCommand }> = [];
  const reports: ModelRegistryReport[] = [];
  const model = fromCallback<ModelCommand, ModelInput>(({ input, receive }) => {
    live.set(input.id, input);
    receive((cmd) => told.push({ id: input.id, cmd }));
    return () => live.delete(input.id);
  });
  const node = createActor(fromCallback(({ receive }) => receive((e: ModelRegistryReport) => reports.push(e)))).start();
  const actor = createActor(modelRegistryMachine.provide({ actors: { model: model as never } }), { input: { ...input, node } });
  const errors: unknown[] = [];
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  for (const step of steps) {
    if (step.event.type === 'xstate.init') continue;
    const before = actor.getSnapshot();
    const reportsBefore = reports.length;
    actor.send(step.event as never);
    check(before, actor.getSnapshot(), step.event as any, { live, told, reports, fresh: reports.slice(reportsBefore) });
  }
  assert.equal(errors, [], 'the machine raised no error');
  actor.stop();
  node.stop();
}

function check(before: any, snap: any, event: any, w: { live: Map<string, ModelInput>; told: Array<{ id: string; cmd: ModelCommand }>; reports: ModelRegistryReport[]; fresh: ModelRegistryReport[] }) {
  const state = String(snap.value);
  const where = `${state} after ${event.type}${event.id ? ` ${event.id}` : ''}`;
  const models: ModelEntry[] = snap.context.models;
  const has = (type: string) => w.fresh.some((r) => r.type === type);
  if (snap.status === 'done') assert.is(w.live.size, 0, `${where}: ended, it leaves no model actor`);
  else assert.equal([...w.live.keys()].sort(), models.map((m) => m.id).sort(), `${where}: a live model actor for each listed model, and none other`);
  assert.is(w.live.get('model-0')?.join ?? FORMS_GROUP, FORMS_GROUP, `${where}: the first model joins as the group's`);
  for (const [id, i] of w.live) if (id !== 'model-0') assert.is(i.join ?? LOADED_BESIDE, LOADED_BESIDE, `${where}: ${id} loads beside it`);
  const ready = w.reports.filter((r) => r.type === 'STARTUP_MODELS_SERVING');
  if (state === 'startup') assert.is(ready.length, 0, `${where}: not ready before every startup model serves`);
  if (state === 'running') {
    assert.is(ready.length, 1, `${where}: the node was told once that it is ready`);
    assert.equal((ready[0] as any).digests, ['digest-model-0'], `${where}: with the first model's digests, for the group's barrier`);
  }
  if (event.type === 'MODEL_FAILED') {
    const m = (before.context.models as ModelEntry[]).find((x) => x.id === event.id);
    const failsNode = String(before.value) === 'startup' ? m?.startup && !m.restored : String(before.value) === 'running' && m?.formsGroup;
    assert.is(has('MODEL_FAILS_NODE'), Boolean(failsNode), `${where}: the node fails exactly when a model it cannot lose fails`);
    if (!failsNode) assert.not.ok(models.some((x) => x.id === event.id), `${where}: a model that fails alone is dropped`);
  }
  if (event.type === 'MODEL_SERVING' && models.some((m) => m.id === event.id)) {
    const name = models.find((m) => m.id === event.id)!.name;
    for (const m of models) if (m.name === name && m.id !== event.id) assert.ok(m.unloaded, `${where}: the older version ${m.id} of "${name}" drains`);
  }
  if (event.type === 'MODEL_STALE' && models.some((m) => m.id === event.id)) assert.ok(w.fresh.some((r) => r.type === 'MODEL_RELOAD' && r.spec.name === 'draft'), `${where}: the node loads it again`);
  if (event.type === 'KEEPER_BACK') for (const m of models) if (!m.gone) assert.ok(w.told.some((t) => t.id === m.id && t.cmd.type === 'KEEPER_BACK'), `${where}: ${m.id} hears the keeper is back`);
  if (state === 'stopping') for (const m of models) if (!m.gone) assert.ok(w.told.some((t) => t.id === m.id && t.cmd.type === 'MODEL_STOP'), `${where}: ${m.id} was told to stop`);
  if (state === 'stopped') assert.ok(w.reports.some((r) => r.type === 'MODELS_STOPPED'), `${where}: the node hears every model stopped`);
  if (state === 'stopTimedOut') assert.ok(w.reports.some((r) => r.type === 'MODELS_STOP_TIMED_OUT' && r.failure.code === 'E_STOP_TIMEOUT'), `${where}: the node hears the stop timed out`);
}

test('shortest paths reach every state, and each state holds its invariants', () => {
  const paths = getShortestPaths(modelRegistryMachine, options);
  const reached = new Set(paths.map((p) => String(p.state.value)));
  for (const s of ['startup', 'running', 'stopping', 'stopped', 'stopTimedOut', 'halted']) assert.ok(reached.has(s), `state ${s} is reachable`);
  for (const p of paths) replay(p.steps as any);
});

test("a newer version drains the older; node 0's verdict reaches the model actor of that version, and a model that spans the group is announced to it", () => {
  const spanning = { ...newer, placement: { ...newer.placement, nnodes: 2 } } as PlannedModel;
  const told: Array<{ id: string; cmd: ModelCommand }> = [];
  const reports: ModelRegistryReport[] = [];
  const model = fromCallback<ModelCommand, ModelInput>(({ input, receive }) => receive((cmd) => told.push({ id: input.id, cmd })));
  const node = createActor(fromCallback(({ receive }) => receive((e: ModelRegistryReport) => reports.push(e)))).start();
  const actor = createActor(modelRegistryMachine.provide({ actors: { model: model as never } }), { input: { ...input, startup: [fakePlanned], node } }).start();
  actor.send(serving('model-0') as never);
  actor.send({ type: 'MODEL_LOAD', id: 'load-2', planned: newer });
  actor.send(serving('load-2') as never);
  assert.ok(actor.getSnapshot().context.models.find((m) => m.id === 'model-0')!.unloaded, 'a newer version of a name serves: the older drains');
  assert.equal(told.filter((t) => t.cmd.type === 'MODEL_UNLOAD'), [{ id: 'model-0', cmd: { type: 'MODEL_UNLOAD', force: false } }]);
  actor.send({ type: 'MODEL_LOAD', id: 'load-1', planned: spanning });
  assert.ok(reports.some((r) => r.type === 'TELL_GROUP' && r.command.type === 'MODEL_GROUP_JOIN' && r.command.fingerprint === 'newer'), 'the group hears the join');
  actor.send({ type: 'MODEL_RESIDENT', id: 'load-1' });
  assert.ok(reports.some((r) => r.type === 'TELL_GROUP' && r.command.type === 'MODEL_GROUP_RESIDENT'), 'and that it is resident here');
  actor.send({ type: 'MODEL_GROUP_COMMIT', name: 'other', fingerprint: 'newer' });
  assert.equal(told.filter((t) => t.cmd.type === 'MODEL_COMMIT'), [], 'a verdict on another name reaches nobody');
  actor.send({ type: 'MODEL_GROUP_COMMIT', name: spanning.spec.name, fingerprint: 'newer' });
  assert.equal(told.filter((t) => t.cmd.type === 'MODEL_COMMIT'), [{ id: 'load-1', cmd: { type: 'MODEL_COMMIT' } }]);
  assert.is(actor.getSnapshot().context.models.find((m) => m.id === 'load-1')!.group, 'committed');
  actor.stop();
  node.stop();
});

test.run();
