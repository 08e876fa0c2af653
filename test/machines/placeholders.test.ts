// The supervisor declares its actors as typed placeholders: a machine started without
// .provide() fails at once, naming the missing actor, instead of loading implementations.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, waitFor } from 'xstate';
import { supervisorActors, supervisorMachine } from '../../src/machines/supervisor.js';
import { nodeActors } from '../../src/actors/nodeActors.js';
import { fakeInput } from '../helpers/fakeNode.js';

test('without .provide() the node fails, naming the actor that was not provided', async () => {
  const actor = createActor(supervisorMachine, { input: fakeInput() });
  actor.start();
  const snap = await waitFor(actor, (s) => s.status === 'done');
  assert.is(snap.value, 'failed');
  assert.is(snap.context.failure?.code, 'E_INTERNAL');
  assert.match(snap.context.failure!.message, /"prepareNode" actor was not provided/);
});

test('startNode provides an implementation for every placeholder, and nothing else', () => {
  assert.equal(Object.keys(nodeActors).sort(), Object.keys(supervisorActors).sort());
});

test.run();
