// Node 0's model groups across attempts (src/rendezvous/modelGroupRegistry.ts): an aborted attempt's
// verdict reaches a node that joins it late, but never a node that already knows the outcome and
// tries again (a node that failed, then had its files fixed, or a member retrying).
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ModelGroups } from '../../src/rendezvous/modelGroupRegistry.js';
import type { ServerMessage } from '../../src/rendezvous/groupMessages.js';

const F = 'f'.repeat(64);

function groups(nnodes: number) {
  const sent: Array<{ to: number[]; message: ServerMessage }> = [];
  const g = new ModelGroups({ nnodes, timeoutMs: 60_000, log: pino({ level: 'silent' }), send: (to, message) => void sent.push({ to, message }) });
  const join = (nodeRank: number) => g.receive(nodeRank, { type: 'model_join', name: 'm', fingerprint: F, tpSize: nnodes });
  const failUnplanned = (nodeRank: number) => g.receive(nodeRank, { type: 'model_failed', name: 'm', code: 'E_ST_DATA_TRUNCATED', message: 'cut short' });
  /** What these node ranks were sent since `from`, by type. */
  const heard = (nodeRank: number, from: number) => sent.slice(from).filter((s) => s.to.includes(nodeRank)).map((s) => s.message.type);
  return { g, sent, join, failUnplanned, heard };
}

test('a node that could not plan the version, then joins it, starts a new attempt: it is not told the old abort', () => {
  const x = groups(2);
  x.join(0);
  x.failUnplanned(1);
  assert.equal(x.heard(0, 0), ['model_waiting', 'model_abort'], 'node 0 hears node 1 failed');
  const mark = x.sent.length;
  x.join(1);
  assert.equal(x.heard(1, mark), ['model_waiting'], 'node 1 gathers a new group, it hears no stale abort');
  x.join(0);
  for (const r of [0, 1]) x.g.receive(r, { type: 'model_resident', name: 'm', fingerprint: F });
  assert.equal(x.heard(0, mark), ['model_commit'], 'node 0 joins the new attempt, which commits once both are resident');
  x.g.close();
});

test('a node that never heard an attempt\'s abort is told it when it joins; a member that heard it and joins again starts a new attempt', () => {
  const late = groups(3);
  late.join(0);
  late.failUnplanned(1);
  const mark = late.sent.length;
  late.join(2);
  assert.equal(late.heard(2, mark), ['model_abort'], 'the latecomer hears the verdict of the attempt it joins');
  assert.is((late.sent.at(-1)!.message as { code: string }).code, 'E_MODEL_GROUP_PEER_FAILED');
  late.g.close();

  const again = groups(3);
  again.join(0);
  again.failUnplanned(1);
  const retry = again.sent.length;
  again.join(0);
  assert.equal(again.heard(0, retry), ['model_waiting'], 'a retry by a node that was told is a new attempt, not the old abort');
  again.g.close();
});

test.run();
