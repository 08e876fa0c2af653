// The model registry's vouches (src/models/modelRegistryMachine.ts, MODEL_GROUP_VOUCH: a node that
// serves a version already joins its swap across the group as resident) keep node 0's verdict for
// whoever waits on it; once settled and its name no longer served, nothing reads it again, so it
// goes: a long-running node that swaps many names across its group keeps no entry per name ever
// vouched for. One still awaiting its verdict stays, whatever goes meanwhile.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, fromCallback } from 'xstate';
import type { ModelCommand, ModelInput } from '../../src/models/modelMachine.js';
import { modelRegistryMachine } from '../../src/models/modelRegistryMachine.js';
import type { PlannedModel } from '../../src/models/planModel.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import { fakePlanned } from '../helpers/fakeNode.js';

const draft = { ...fakePlanned, spec: { ...fakePlanned.spec, name: 'draft' }, plan: { ...fakePlanned.plan, fingerprint: 'draft' }, origin: 'restore' } as PlannedModel;
const entries = (id: string) => [{ globalRank: 0, localRank: 0, socketPath: `/fake/${id}.sock`, deviceUuid: 'fake-0', fingerprint: id }];
const vouch = (id: string, name: string) => ({ type: 'MODEL_GROUP_VOUCH', id, join: { name, fingerprint: name, fingerprintFields: {}, tpSize: 1 } }) as const;

test('a settled vouch goes with the last model of its name; one awaiting its verdict stays until it settles and its name is gone', () => {
  const model = fromCallback<ModelCommand, ModelInput>(() => () => {});
  const nobody = createActor(fromCallback(() => {})).start();
  const actor = createActor(modelRegistryMachine.provide({ actors: { model: model as never } }), {
    input: {
      node: nobody, startup: [fakePlanned, draft], socketDir: '/fake', cudaHandles: 'ipc', log: pino({ level: 'silent' }),
      rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry(),
    },
  }).start();
  for (const id of ['model-0', 'model-1']) actor.send({ type: 'MODEL_SERVING', id, entries: entries(id), digests: [] } as never);
  assert.is(actor.getSnapshot().value, 'running');
  const vouched = () => actor.getSnapshot().context.vouched.map((v) => [v.id, v.name, v.verdict !== undefined]);

  actor.send(vouch('vouch-1', 'draft'));
  actor.send({ type: 'MODEL_GROUP_COMMIT', name: 'draft', fingerprint: 'draft' });
  // One awaiting its verdict, for a name this node does not serve (yet).
  actor.send(vouch('vouch-2', 'gone-soon'));
  assert.equal(vouched(), [['vouch-1', 'draft', true], ['vouch-2', 'gone-soon', false]]);

  actor.send({ type: 'MODEL_GONE', id: 'model-1' });
  assert.equal(vouched(), [['vouch-2', 'gone-soon', false]], "draft's settled vouch went with draft; the awaited one stays");

  actor.send({ type: 'MODEL_GROUP_ABORT', name: 'gone-soon', fingerprint: 'gone-soon', error: { name: 'WeightdError', code: 'E_TEST', message: 'no' } });
  assert.equal(vouched(), [['vouch-2', 'gone-soon', true]], 'its waiter reads the verdict in this step');
  actor.send(vouch('vouch-3', 'tiny-llama'));
  assert.equal(vouched(), [['vouch-3', 'tiny-llama', false]], 'the next vouch finds it settled and unread since: gone');
  actor.stop();
});

test.run();
