// Model-based test of a node's membership of its group (src/machines/groupMemberMachine.ts):
// xstate/graph enumerates the paths through the machine with everything node 0 can say, every
// connection loss, every clock and every local request, in any order; each path is replayed
// against a live actor whose connection is a recorder. At every step the member's promises must
// hold: start-up is all-or-nothing and serving never fails; the supervisor hears the table and
// the group's readiness once each, a peer lost before it is back and each only once; ready goes
// to node 0 only on a connection that has the rank table, after the ranks serve; a join only
// answers a hello; a model is served only on a verdict for a join it made; and a member that
// ends says leaving once, and nothing after.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor } from 'xstate';
import { getShortestPaths } from 'xstate/graph';
import { groupMemberMachine, type GroupMemberEvent, type GroupMemberInput } from '../../src/machines/groupMemberMachine.js';
import type { GroupEvent } from '../../src/rendezvous/groupEvents.js';
import type { ClientMessage } from '../../src/rendezvous/groupMessages.js';

const FAR = 1e8;
const timing = { heartbeatMs: FAR, peerTimeoutMs: FAR, retryMinMs: 1000, retryMaxMs: 8000, handshakeMs: FAR, joinMs: FAR };
const after = (delay: string, state: string) => ({ type: `xstate.after.${delay}.groupMember.${state}` });
const model = { name: 'draft', fingerprint: 'd'.repeat(64), tpSize: 4 };
/** Another version of the same name. */
const other = { ...model, fingerprint: 'e'.repeat(64) };

const events = [
  { type: 'HELLO' },
  { type: 'WAITING', joined: [1], missing: [0] },
  { type: 'JOINED', rankTable: [] },
  { type: 'GROUP_READY', lost: [] },
  { type: 'GROUP_READY', lost: [2] },
  { type: 'PEER_LOST', nodeRank: 2, reason: 'gone' },
  { type: 'PEER_BACK', nodeRank: 2 },
  { type: 'REJECTED', rejection: { code: 'E_RDZV_FINGERPRINT', message: 'another checkpoint' } },
  { type: 'LEAVING', reason: 'node 0 stops' },
  { type: 'MODEL_WAITING', ...model, joined: [1], missing: [0] },
  { type: 'MODEL_VERDICT', verdict: { type: 'model_commit', name: model.name, fingerprint: model.fingerprint } },
  { type: 'MODEL_VERDICT', verdict: { type: 'model_abort', name: model.name, fingerprint: model.fingerprint, code: 'E_MODEL_GROUP_PEER_FAILED', message: 'node 2 failed it' } },
  { type: 'LINK_CLOSED', reason: 'connection reset' },
  { type: 'LINK_CLOSED', reason: 'protocol error: bad frame', protocolError: 'bad frame' },
  { type: 'NODE_READY' },
  { type: 'NODE_FAILED', error: { name: 'RankFailedError', code: 'E_RANK_EXIT', message: 'rank 1 exited' } },
  { type: 'MODEL_JOIN', join: model },
  { type: 'MODEL_JOIN', join: other },
  { type: 'MODEL_RESIDENT', name: model.name, fingerprint: model.fingerprint },
  { type: 'MODEL_FAILED', name: model.name, fingerprint: model.fingerprint, error: { name: 'DeviceError', code: 'E_OUT_OF_MEMORY', message: 'full' } },
  { type: 'CLOSE' },
  after('rendezvousDeadline', 'starting'),
  after('handshake', 'starting.connecting'),
  after('handshake', 'serving.connecting'),
  after('retry', 'starting.retrying'),
  after('retry', 'serving.retrying'),
];

class Link {
  connects = 0;
  sent: ClientMessage[] = [];
  closes: string[] = [];
  destroys: string[] = [];
  leaves: string[] = [];
  emitted: GroupEvent[] = [];
  implementations() {
    return {
      actions: {
        connect: () => void this.connects++,
        send: (_: unknown, m: ClientMessage) => void this.sent.push(m),
        sendJoin: () => void this.sent.push({ type: 'join' } as ClientMessage),
        closeLink: (_: unknown, p: { reason: string }) => void this.closes.push(p.reason),
        destroyLink: (_: unknown, p: { reason: string }) => void this.destroys.push(p.reason),
        leave: (_: unknown, p: { reason: string }) => void this.leaves.push(p.reason),
      },
    };
  }
}

const input = (link?: Link): GroupMemberInput => ({
  host: '10.0.0.1', port: 29500, nnodes: 3, localWorldSize: 2, rendezvousTimeoutMs: FAR, timing, startedAt: performance.now(),
  log: pino({ level: 'silent' }), emit: (e) => link?.emitted.push(e),
});

/** The states whose connection node 0 said hello on. */
const saidHello = new Set([{ starting: 'joining' }, { starting: 'waiting' }, 'loading', { serving: 'inGroup' }, { serving: 'rejoining' }].map((s) => JSON.stringify(s)));
type Snap = ReturnType<ReturnType<typeof createActor<typeof groupMemberMachine>>['getSnapshot']>;
const top = (s: Snap) => (typeof s.value === 'string' ? s.value : Object.keys(s.value)[0]!);
const types = (xs: Array<{ type: string }>) => xs.map((x) => x.type);

function replay(steps: Array<{ type: string }>) {
  const link = new Link();
  const errors: unknown[] = [];
  const actor = createActor(groupMemberMachine.provide(link.implementations()), { input: input(link) });
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  const history: Array<{ event: string; before: Snap; after: Snap }> = [];
  for (const event of steps) {
    if (event.type === 'xstate.init') continue;
    const before = actor.getSnapshot();
    if (before.status !== 'active') break;
    const counts = { sent: link.sent.length, emitted: link.emitted.length, leaves: link.leaves.length };
    actor.send(event as GroupMemberEvent);
    history.push({ event: event.type, before, after: actor.getSnapshot() });
    check(link, history, counts);
  }
  assert.equal(errors, [], 'the machine raised no error');
  const last = actor.getSnapshot();
  actor.stop();
  return { link, last };
}

function check(link: Link, history: Array<{ event: string; before: Snap; after: Snap }>, counts: { sent: number; emitted: number; leaves: number }) {
  const { event, before, after: snap } = history.at(-1)!;
  const where = `${JSON.stringify(snap.value)} after ${history.map((h) => h.event).join(' > ')}`;
  const emitted = types(link.emitted);
  const newlyEmitted = link.emitted.slice(counts.emitted);
  const newlySent = link.sent.slice(counts.sent);
  assert.ok(emitted.filter((t) => t === 'GROUP_JOINED').length <= 1, `${where}: the table is announced once`);
  assert.ok(emitted.filter((t) => t === 'GROUP_READY').length <= 1, `${where}: the group is ready once`);
  const failedAt = emitted.indexOf('GROUP_FAILED');
  if (failedAt >= 0) {
    assert.is(failedAt, emitted.length - 1, `${where}: nothing after GROUP_FAILED`);
    assert.not.ok(emitted.includes('GROUP_READY'), `${where}: a group that was ready never fails`);
    assert.is(snap.value, 'failed', `${where}: failed`);
  }
  if (emitted.includes('GROUP_READY')) assert.ok(['serving', 'closed'].includes(top(snap)), `${where}: serving until the node ends`);
  // A peer is lost, then back, then lost again: never twice in a row, and only once the group was ready.
  const peers = new Map<number, string>();
  for (const e of link.emitted) {
    if (e.type !== 'PEER_LOST' && e.type !== 'PEER_BACK') continue;
    assert.ok(emitted.indexOf('GROUP_READY') >= 0 && link.emitted.indexOf(e) > emitted.indexOf('GROUP_READY'), `${where}: peers only matter once the group is ready`);
    assert.is.not(peers.get(e.nodeRank) ?? 'PEER_BACK', e.type, `${where}: node ${e.nodeRank} ${e.type} twice in a row`);
    peers.set(e.nodeRank, e.type);
  }
  const lostNow = [...peers].filter(([, t]) => t === 'PEER_LOST').map(([r]) => r).sort();
  if (snap.status === 'active') assert.equal(snap.context.lost.map((l) => l.nodeRank).sort(), lostNow, `${where}: the lost set is what the supervisor heard`);
  for (const m of newlySent) {
    if (m.type === 'ready') {
      assert.ok(top(snap) === 'loading' || snap.matches({ serving: 'inGroup' }), `${where}: ready only on a connection with the rank table`);
      assert.ok(history.some((h) => h.event === 'NODE_READY'), `${where}: ready only once the ranks serve`);
    }
    if (m.type === 'join') assert.is(event, 'HELLO', `${where}: a join answers a hello`);
    if (m.type === 'failed') assert.ok(saidHello.has(JSON.stringify(before.value)), `${where}: node 0 hears a failure only on a connection it said hello on`);
  }
  for (const e of newlyEmitted) {
    if (e.type === 'MODEL_GROUP_COMMIT') assert.ok(link.sent.some((m) => m.type === 'model_join'), `${where}: a commit answers a join this node made`);
  }
  // A version pending in the group stays so until its verdict, its failure or the loss of node 0:
  // another join of its name neither forgets it nor aborts it.
  const joined = history.at(-1)!.event === 'MODEL_JOIN' ? before.context.models[model.name] : undefined;
  if (joined !== undefined) {
    assert.is(snap.context.models[model.name], joined, `${where}: a second join keeps the pending version`);
    assert.not.ok(newlyEmitted.some((e) => e.type === 'MODEL_GROUP_ABORT' && e.fingerprint === joined), `${where}: a second join does not abort the pending version`);
    assert.not.ok(newlySent.some((m) => m.type === 'model_join'), `${where}: node 0 hears one join of a name at a time`);
  }
  if (snap.status === 'done') {
    assert.is(link.leaves.length, 1, `${where}: a member that ends says leaving once`);
    assert.is(link.leaves.length - counts.leaves, 1, `${where}: and it says it as it ends`);
  } else assert.is(link.leaves.length, 0, `${where}: leaving only at the end`);
  if (top(snap) === 'starting' && top(before) === 'serving') assert.unreachable(`${where}: serving never starts over`);
}

test('shortest paths reach every state, and each step holds the member\'s promises', () => {
  const paths = getShortestPaths(groupMemberMachine, {
    input: input(),
    events: events as never[],
    serializeState: (s: any) => JSON.stringify([s.value, s.context.lost.map((l: any) => l.nodeRank), Object.keys(s.context.models), s.context.ready !== undefined, s.context.retryDelayMs]),
  });
  const reached = new Set(paths.map((p) => JSON.stringify(p.state.value)));
  for (const s of [
    { starting: 'connecting' }, { starting: 'joining' }, { starting: 'waiting' }, { starting: 'retrying' }, 'loading',
    { serving: 'inGroup' }, { serving: 'retrying' }, { serving: 'connecting' }, { serving: 'rejoining' }, 'failed', 'closed',
  ]) assert.ok(reached.has(JSON.stringify(s)), `state ${JSON.stringify(s)} is reachable`);
  assert.ok(paths.length > 100, `walked ${paths.length} paths`);
  for (const p of paths) replay(p.steps.map((s) => s.event));
});

const toServing = [{ type: 'HELLO' }, { type: 'WAITING', joined: [1], missing: [0, 2] }, { type: 'JOINED', rankTable: [] }, { type: 'NODE_READY' }, { type: 'GROUP_READY', lost: [] }];

const table: Array<{ what: string; steps: Array<{ type: string; [field: string]: unknown }>; emitted: string[]; sent: string[]; state: unknown }> = [
  {
    what: 'a connection lost before node 0 accepted the join is retried; one lost after fails the group',
    steps: [{ type: 'HELLO' }, { type: 'LINK_CLOSED', reason: 'reset' }, after('retry', 'starting.retrying'), { type: 'HELLO' }, { type: 'WAITING', joined: [1], missing: [0] }, { type: 'LINK_CLOSED', reason: 'reset' }],
    emitted: ['GROUP_WAITING', 'GROUP_FAILED'],
    sent: ['join', 'join'],
    state: 'failed',
  },
  {
    what: 'something that is not a coordinator fails the start at once; the deadline without an answer fails it too',
    steps: [{ type: 'LINK_CLOSED', reason: 'protocol error', protocolError: 'bad frame' }],
    emitted: ['GROUP_FAILED'],
    sent: [],
    state: 'failed',
  },
  {
    what: 'the deadline while waiting for others tells node 0 why this node gives up',
    steps: [{ type: 'HELLO' }, { type: 'WAITING', joined: [1], missing: [0, 2] }, after('rendezvousDeadline', 'starting')],
    emitted: ['GROUP_WAITING', 'GROUP_FAILED'],
    sent: ['join', 'failed'],
    state: 'failed',
  },
  {
    what: 'serving, losing node 0 is PEER_LOST 0; a coordinator there that takes this node back makes it PEER_BACK 0, and ready goes out at the table',
    steps: [...toServing, { type: 'LINK_CLOSED', reason: 'reset' }, after('retry', 'serving.retrying'), { type: 'HELLO' }, { type: 'JOINED', rankTable: [] }, { type: 'GROUP_READY', lost: [] }],
    emitted: ['GROUP_WAITING', 'GROUP_JOINED', 'GROUP_READY', 'PEER_LOST', 'PEER_BACK'],
    sent: ['join', 'ready', 'join', 'ready'],
    state: { serving: 'inGroup' },
  },
  {
    what: 'a refused rejoin closes the link and keeps trying; the node keeps serving',
    steps: [...toServing, { type: 'LINK_CLOSED', reason: 'reset' }, after('retry', 'serving.retrying'), { type: 'HELLO' }, { type: 'REJECTED', rejection: { code: 'E_RDZV_FINGERPRINT', message: 'other' } }, { type: 'LINK_CLOSED', reason: 'refused' }],
    emitted: ['GROUP_WAITING', 'GROUP_JOINED', 'GROUP_READY', 'PEER_LOST'],
    sent: ['join', 'ready', 'join'],
    state: { serving: 'retrying' },
  },
  {
    what: 'a model joined across the group is aborted when node 0 goes during its load; one joined while node 0 is gone is aborted at once',
    steps: [...toServing, { type: 'MODEL_JOIN', join: model }, { type: 'LINK_CLOSED', reason: 'reset' }, { type: 'MODEL_JOIN', join: model }],
    emitted: ['GROUP_WAITING', 'GROUP_JOINED', 'GROUP_READY', 'MODEL_GROUP_ABORT', 'PEER_LOST', 'MODEL_GROUP_ABORT'],
    sent: ['join', 'ready', 'model_join'],
    state: { serving: 'retrying' },
  },
  {
    what: "node 0's commit serves a model this node joined; the same version joining again meanwhile changes nothing",
    steps: [...toServing, { type: 'MODEL_JOIN', join: model }, { type: 'MODEL_JOIN', join: model }, { type: 'MODEL_RESIDENT', name: model.name, fingerprint: model.fingerprint }, { type: 'MODEL_JOIN', join: model }, { type: 'MODEL_VERDICT', verdict: { type: 'model_commit', ...model } }],
    emitted: ['GROUP_WAITING', 'GROUP_JOINED', 'GROUP_READY', 'MODEL_GROUP_COMMIT'],
    sent: ['join', 'ready', 'model_join', 'model_resident'],
    state: { serving: 'inGroup' },
  },
  {
    what: 'another version of a pending name is refused (E_MODEL_GROUP_MISMATCH naming both); the pending one keeps its place and is served on its commit',
    steps: [...toServing, { type: 'MODEL_JOIN', join: model }, { type: 'MODEL_JOIN', join: other }, { type: 'MODEL_RESIDENT', name: model.name, fingerprint: model.fingerprint }, { type: 'MODEL_VERDICT', verdict: { type: 'model_commit', ...model } }],
    emitted: ['GROUP_WAITING', 'GROUP_JOINED', 'GROUP_READY', 'MODEL_GROUP_ABORT', 'MODEL_GROUP_COMMIT'],
    sent: ['join', 'ready', 'model_join', 'model_resident'],
    state: { serving: 'inGroup' },
  },
  {
    what: 'a node that fails tells node 0 once it said hello, then leaves',
    steps: [{ type: 'HELLO' }, { type: 'NODE_FAILED', error: { name: 'E', code: 'E_RANK_EXIT', message: 'rank died' } }],
    emitted: [],
    sent: ['join', 'failed'],
    state: 'closed',
  },
];

test('the refusal of another version names the version pending and the one refused', () => {
  const { link } = replay([...toServing, { type: 'MODEL_JOIN', join: model }, { type: 'MODEL_JOIN', join: other }] as Array<{ type: string }>);
  const abort = link.emitted.find((e) => e.type === 'MODEL_GROUP_ABORT');
  assert.ok(abort?.type === 'MODEL_GROUP_ABORT');
  assert.is(abort.fingerprint, other.fingerprint, 'the refused version is aborted, not the pending one');
  assert.is(abort.error.code, 'E_MODEL_GROUP_MISMATCH');
  assert.is(
    abort.error.message,
    `model "draft": this node is loading version ${'d'.repeat(12)}… of it across the group, so version ${'e'.repeat(12)}… was refused; load it once that one serves or fails (weightd ctl list shows it)`,
  );
  assert.equal(abort.error.details, { field: 'fingerprint', value: other.fingerprint, expected: model.fingerprint });
});

for (const row of table) {
  test(`table: ${row.what}`, () => {
    const { link, last } = replay(row.steps);
    assert.equal(types(link.emitted), row.emitted);
    assert.equal(types(link.sent), row.sent);
    assert.equal(last.value, row.state);
  });
}

test.run();
