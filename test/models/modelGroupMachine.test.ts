// A model group on node 0 (src/models/modelGroupMachine.ts), driven with its members' messages: it
// commits only once every node has joined and is resident, and any failure, loss, disagreement
// or the deadline aborts it with one verdict sent to every node.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor } from 'xstate';
import { modelGroupMachine, type ModelGroupEvent } from '../../src/models/modelGroupMachine.js';
import type { ServerMessage } from '../../src/rendezvous/groupMessages.js';

const A = 'a'.repeat(64);
const B = 'b'.repeat(64);
const fields = { content: 'c1', headers: 'h1' };

function group(nnodes = 3, timeoutMs = 60_000) {
  const sent: Array<{ to: number[]; message: ServerMessage }> = [];
  const actor = createActor(modelGroupMachine.provide({ actions: { send: (_, p) => void sent.push({ to: p.nodeRanks, message: p.message }) } }), {
    input: { name: 'm', fingerprint: A, fingerprintFields: fields, tpSize: 4, nnodes, firstNodeRank: 1, timeoutMs, log: pino({ level: 'silent' }) },
  });
  actor.start();
  const send = (...events: ModelGroupEvent[]) => events.forEach((e) => actor.send(e));
  const join = (nodeRank: number, over: Partial<Extract<ModelGroupEvent, { type: 'JOIN' }>> = {}) => ({ type: 'JOIN' as const, nodeRank, fingerprint: A, fingerprintFields: fields, tpSize: 4, ...over });
  return { actor, sent, send, join, last: () => sent.at(-1)!.message, state: () => String(actor.getSnapshot().value) };
}

test('commits once every node joined and is resident, not before; the commit goes to every node', () => {
  const g = group();
  assert.equal(g.sent[0], { to: [1], message: { type: 'model_waiting', name: 'm', fingerprint: A, joined: [1], missing: [0, 2] } });
  g.send({ type: 'RESIDENT', nodeRank: 1 }, g.join(0), { type: 'RESIDENT', nodeRank: 0 }, { type: 'RESIDENT', nodeRank: 2 });
  assert.is(g.state(), 'gathering', 'a node that has not joined is not counted resident');
  g.send(g.join(0), g.join(2));
  assert.is(g.state(), 'loading', 'everyone joined; node 2 must say resident after its join');
  g.send({ type: 'RESIDENT', nodeRank: 2 });
  assert.is(g.state(), 'committed');
  assert.equal(g.last(), { type: 'model_commit', name: 'm', fingerprint: A });
  assert.equal(g.sent.at(-1)!.to, [0, 1, 2]);
});

test('a node that fails the load aborts it everywhere, naming the node and its cause', () => {
  const g = group();
  g.send(g.join(0), { type: 'RESIDENT', nodeRank: 1 }, { type: 'FAILED', nodeRank: 2, code: 'E_DOES_NOT_FIT', message: 'no room' });
  assert.is(g.state(), 'aborted');
  const abort = g.last() as Extract<ServerMessage, { type: 'model_abort' }>;
  assert.is(abort.code, 'E_MODEL_GROUP_PEER_FAILED');
  assert.is(abort.message, 'model "m" failed on node 2: E_DOES_NOT_FIT: no room');
  assert.equal(g.sent.at(-1)!.to, [0, 1, 2], 'nodes that never joined hear it too');
});

test('another version or tp size under the name aborts it; the offender hears it for the version it loads', () => {
  const g = group();
  g.send(g.join(0, { fingerprint: B, fingerprintFields: { content: 'c2', headers: 'h1' } }));
  assert.is(g.state(), 'aborted');
  const [offender, all] = g.sent.slice(-2);
  assert.equal(all!.to, [0, 1, 2]);
  assert.is((all!.message as { fingerprint: string }).fingerprint, A);
  assert.equal(offender!.to, [0]);
  assert.is((offender!.message as { fingerprint: string }).fingerprint, B);
  assert.match((all!.message as { message: string }).message, /node 0's checkpoint has fingerprint bbbbbbbbbbbb…, node 1's aaaaaaaaaaaa… \(fields that differ: content\)/);
  const tp = group();
  tp.send(tp.join(2, { tpSize: 2 }));
  assert.is((tp.last() as { code: string }).code, 'E_MODEL_GROUP_MISMATCH');
  assert.match((tp.last() as { message: string }).message, /node 2 loads it at tp 2, node 1 at tp 4/);
});

test('losing a node that joined aborts it; losing one that never joined does not', () => {
  const g = group();
  g.send({ type: 'NODE_LOST', nodeRank: 2, reason: 'gone' });
  assert.is(g.state(), 'gathering');
  g.send(g.join(2), { type: 'NODE_LOST', nodeRank: 2, reason: 'connection reset' });
  assert.is(g.state(), 'aborted');
  assert.is((g.last() as { code: string }).code, 'E_MODEL_GROUP_PEER_LOST');
});

test('the deadline aborts a group that never completed, naming the nodes missing', async () => {
  const g = group(3, 5);
  g.send(g.join(0));
  await new Promise<void>((resolve) => g.actor.subscribe((s) => s.status === 'done' && resolve()));
  const abort = g.last() as Extract<ServerMessage, { type: 'model_abort' }>;
  assert.is(abort.code, 'E_MODEL_GROUP_TIMEOUT');
  assert.match(abort.message, /node rank 2 did not load it within 0.005 s of node 1 \(joined: 0, 1\)/);
});

test.run();
