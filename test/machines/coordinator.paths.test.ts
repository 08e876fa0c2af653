// Model-based test of the rendezvous coordinator's machine: xstate/graph enumerates the paths
// through it for a two-node group (good joins, a bad one, a rejoin, ready, losses, a failure
// report, the deadline, verdicts written), and each path is replayed against a live actor whose
// I/O actions are recorded, checking at every step what the protocol promises in that state.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, type SnapshotFrom } from 'xstate';
import { getShortestPaths, getSimplePaths } from 'xstate/graph';
import { LogLimiter } from '../../src/wire/logLimiter.js';
import { coordinatorMachine, type CoordinatorEvent } from '../../src/machines/coordinator.js';
import { RDZV_PROTOCOL_VERSION, type JoinMessage, type ServerMessage } from '../../src/rendezvous/groupMessages.js';

type Snap = SnapshotFrom<typeof coordinatorMachine>;
const FINGERPRINT = 'f'.repeat(64);
const log = pino({ level: 'silent' });

function input(token?: string) {
  return {
    expect: { nnodes: 2, tpSize: 2, localWorldSize: 1, fingerprint: FINGERPRINT, token },
    // Long enough never to fire by itself: the paths send the deadline as an event.
    rendezvousTimeoutMs: 600_000,
    startedAt: performance.now(),
    log,
    strangerLog: new LogLimiter(20, 10_000, () => {}),
  };
}

function join(linkId: number, nodeRank: number, over: Partial<JoinMessage> = {}): CoordinatorEvent {
  return {
    type: 'JOIN', linkId, address: `10.0.0.${linkId}:1`, nonce: `nonce-${linkId}`,
    join: {
      type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, nnodes: 2, tpSize: 2, localWorldSize: 1, nodeRank, hostName: `host${nodeRank}`,
      deviceUuids: [`dev-${linkId}`], visibleDevices: 1, fingerprint: FINGERPRINT, tokenProof: null, ...over,
    },
  };
}

const top = (s: Snap) => (typeof s.value === 'string' ? s.value : Object.keys(s.value)[0]!);

const GATHERING_DEADLINE = 'xstate.after.rendezvousDeadline.coordinator.gathering';
const FAILED_DEADLINE = 'xstate.after.rendezvousDeadline.coordinator.failed.informing';

// The connections of the world the paths run in: nodes 0 and 1, a node 1 with another
// checkpoint, node 1 again on a new connection (a rejoin, once its first one is lost), and
// (link 4) a node 1 that failed before it could join.
const ABORT: CoordinatorEvent = { type: 'ABORT', linkId: 4, address: '10.0.0.4:1', nonce: 'nonce-4', tokenProof: null, nodeRank: 1, hostName: 'host1', code: 'E_PLAN', message: 'bad plan' };
const JOINS: Record<number, CoordinatorEvent> = { 0: join(0, 0), 1: join(1, 1), 2: join(2, 1, { fingerprint: 'e'.repeat(64) }), 3: join(3, 1) };

/**
 * What can happen next. A connection joins at most once and, once closed, says nothing more
 * (the socket side guarantees both; a second join on one connection has its own test), so only
 * connections that never joined may join; only live members report ready or close. Later in
 * the life of the group only the newcomers (2 and 3) still arrive. Verdicts being written finish.
 */
function events(snap: Snap): CoordinatorEvent[] {
  const c = snap.context;
  const phase = top(snap);
  const seen = (id: number) => c.claims.some((x) => x.linkId === id) || c.members.some((m) => m.linkId === id);
  const live = c.members.filter((m) => m.state !== 'lost').map((m) => m.linkId);
  const arriving = (phase === 'gathering' ? [0, 1, 2, 3] : [2, 3]).filter((id) => !seen(id));
  return [
    ...arriving.map((id) => JOINS[id]!),
    ...live.map((linkId) => ({ type: 'READY' as const, linkId })),
    ...live.map((linkId) => ({ type: 'LINK_CLOSED' as const, linkId, reason: 'connection closed by the peer' })),
    ...live.map((linkId) => ({ type: 'LINK_FAILED' as const, linkId, code: 'E_DEVICE_OOM', message: 'out of memory' })),
    // A node that could not start reports it on a connection of its own.
    ...(seen(4) ? [] : [ABORT]),
    { type: 'NODE_FAILED', nodeRank: 1, code: 'E_RANK', message: 'rank 1 exited' },
    ...(phase === 'gathering' ? [{ type: GATHERING_DEADLINE } as unknown as CoordinatorEvent] : []),
    ...(snap.matches({ failed: 'informing' }) ? [{ type: FAILED_DEADLINE } as unknown as CoordinatorEvent] : []),
    ...c.telling.map((t) => ({ type: 'VERDICT_SENT' as const, ...t })),
    { type: 'CLOSE' },
  ];
}

const byLink = (a: { linkId: number }, b: { linkId: number }) => a.linkId - b.linkId;

const graphOptions = {
  input: input(),
  events,
  // Context holds a logger; a path's identity is the state and the group's bookkeeping.
  serializeState: (s: Snap) => {
    const c = s.context;
    return JSON.stringify([s.value, [...c.members].sort(byLink).map((m) => [m.linkId, m.state]), [...c.claims].sort(byLink), [...c.telling].sort(byLink), [...c.told].sort(), c.verdict?.code ?? null]);
  },
};

/** What the actions asked of the connections, per link. */
class FakeLinks {
  readonly sent = new Map<number, ServerMessage[]>();
  readonly refused: Array<{ linkId: number; code: string }> = [];
  readonly told: Array<{ linkId: number; code: string }> = [];

  implementations() {
    return {
      actions: {
        send: (_: unknown, p: { linkIds: number[]; message: ServerMessage }) => {
          for (const id of p.linkIds) this.sent.set(id, [...(this.sent.get(id) ?? []), p.message]);
        },
        refuse: (_: unknown, p: { linkId: number; rejection: { code: string } }) => void this.refused.push({ linkId: p.linkId, code: p.rejection.code }),
        tell: (_: unknown, p: { claims: Array<{ linkId: number }>; verdict: { code: string } }) => {
          for (const c of p.claims) this.told.push({ linkId: c.linkId, code: p.verdict.code });
        },
        closeLink: () => {},
        dropLink: () => {},
      },
    };
  }

  types(linkId: number): string[] {
    return (this.sent.get(linkId) ?? []).map((m) => m.type);
  }
}

interface Step {
  before: Snap;
  after: Snap;
  event: CoordinatorEvent;
}

function replay(steps: Array<{ event: { type: string } }>, token?: string) {
  const links = new FakeLinks();
  const actor = createActor(coordinatorMachine.provide(links.implementations()), { input: input(token) });
  const errors: unknown[] = [];
  actor.subscribe({ error: (e) => errors.push(e) });
  actor.start();
  const visited: Step[] = [];
  for (const step of steps) {
    if (step.event.type === 'xstate.init') continue;
    const before = actor.getSnapshot();
    const sentBefore = new Map([...links.sent].map(([id, msgs]) => [id, msgs.length]));
    actor.send(step.event as CoordinatorEvent);
    const s = { before, after: actor.getSnapshot(), event: step.event as CoordinatorEvent };
    check(s, links, visited, sentBefore);
    visited.push(s);
  }
  assert.equal(errors, [], 'the machine raised no error');
  actor.stop();
  return { visited, links };
}

/** What must hold after each step, whatever the path that led there. */
function check({ before, after, event }: Step, links: FakeLinks, history: Step[], sentBefore: Map<number, number>) {
  const state = JSON.stringify(after.value);
  const where = `${state} after ${event.type}${'linkId' in event ? ` (link ${event.linkId})` : ''}`;
  const ctx = after.context;
  if (top(after) === 'loading' || top(after) === 'serving') {
    assert.is(ctx.rankTable.length, 2, `${where}: the rank table covers both nodes`);
    for (const m of ctx.members.filter((m) => m.state !== 'lost')) {
      assert.ok(links.types(m.linkId).includes('joined'), `${where}: member on link ${m.linkId} has the rank table`);
    }
  }
  if (top(before) === 'gathering' && top(after) === 'gathering') {
    assert.ok([...links.sent.values()].every((msgs) => !msgs.some((m) => m.type === 'joined')), `${where}: no rank table while nodes are missing`);
  }
  if (top(before) !== 'serving' && top(after) === 'serving') {
    for (const m of ctx.members) assert.ok(links.types(m.linkId).includes('group_ready'), `${where}: link ${m.linkId} heard group-ready`);
  }
  if (top(after) === 'failed') {
    assert.ok(ctx.verdict, `${where}: the verdict is recorded`);
    assert.ok(!history.some((h) => top(h.after) === 'serving'), `${where}: a group that was ready is never failed`);
    for (const c of ctx.claims) assert.ok(links.told.some((t) => t.linkId === c.linkId), `${where}: claim on link ${c.linkId} is told the verdict`);
    assert.ok(links.told.every((t) => t.code === ctx.verdict!.code), `${where}: one verdict for everyone`);
  }
  // Node 0 may end once delivered; a node arriving later still hears the verdict if it is in time.
  if (after.matches({ failed: 'delivered' }) && !before.matches({ failed: 'delivered' })) {
    assert.equal(ctx.telling, [], `${where}: delivered only once no verdict is still being written`);
    const heard = [0, 1].every((r) => ctx.told.includes(r) || ctx.members.find((m) => m.nodeRank === r)?.state === 'lost');
    assert.ok(heard || history.some((h) => h.event.type.startsWith('xstate.after.')) || event.type.startsWith('xstate.after.'), `${where}: every node heard, or the deadline passed`);
  }
  // Nothing is ever written to a connection the group knows is gone.
  for (const m of before.context.members.filter((m) => m.state === 'lost')) {
    assert.is(links.sent.get(m.linkId)?.length ?? 0, sentBefore.get(m.linkId) ?? 0, `${where}: nothing sent to lost link ${m.linkId}`);
  }
  if (top(after) === 'closed') assert.is(after.status, 'done', `${where}: closed is final`);
}

test('shortest paths reach every state, and each state holds its invariants', () => {
  const paths = getShortestPaths(coordinatorMachine, graphOptions as never);
  const reached = new Set(paths.map((p) => JSON.stringify(p.state.value)));
  for (const s of ['"gathering"', '"loading"', '"serving"', '{"failed":"informing"}', '{"failed":"pastDeadline"}', '{"failed":"delivered"}', '"closed"']) {
    assert.ok(reached.has(s), `state ${s} is reachable (${[...reached]})`);
  }
  for (const p of paths) replay(p.steps as never);
});

test('every order of start-up events ends serving or failed, failing only before the group was ready', () => {
  const paths = getSimplePaths(coordinatorMachine, {
    ...graphOptions,
    events: (snap: Snap) => events(snap).filter((e) => e.type !== 'CLOSE'),
    toState: (s: Snap) => s.matches('serving') || s.matches('failed'),
  } as never);
  assert.ok(paths.length > 20, `enumerated ${paths.length} paths`);
  const failedFrom = new Set<string>();
  for (const p of paths) {
    const { visited } = replay(p.steps as never);
    const last = visited.at(-1)!;
    if (top(last.after) === 'failed') failedFrom.add(top(last.before));
  }
  assert.equal([...failedFrom].sort(), ['gathering', 'loading']);
});

test('while serving, a lost node is only reported, and the same node rank rejoins', () => {
  const { visited, links } = replay(
    [join(0, 0), join(1, 1), { type: 'READY', linkId: 0 }, { type: 'READY', linkId: 1 }, { type: 'LINK_CLOSED', linkId: 1, reason: 'gone' }, join(3, 1), { type: 'READY', linkId: 3 }].map((event) => ({ event })),
  );
  assert.is(top(visited.at(-1)!.after), 'serving');
  assert.equal(links.types(0), ['waiting', 'joined', 'group_ready', 'peer_lost', 'peer_back']);
  assert.equal(links.types(3), ['joined', 'group_ready']);
  assert.equal(links.refused, []);
});

test('with a token, a join without its proof is turned away alone and named at the timeout', () => {
  const { visited, links } = replay([join(0, 0, { tokenProof: null }), { type: GATHERING_DEADLINE } as unknown as CoordinatorEvent].map((event) => ({ event })), 'secret');
  assert.equal(links.refused, [{ linkId: 0, code: 'E_RDZV_TOKEN' }]);
  const last = visited.at(-1)!.after;
  assert.ok(last.matches({ failed: 'delivered' }));
  assert.is(last.context.verdict!.code, 'E_RDZV_TIMEOUT');
  assert.match(last.context.verdict!.message, /turned away: node 0 \(10\.0\.0\.0:1\) \(E_RDZV_TOKEN\)/);
  assert.equal(links.told, [], 'a node that did not prove the token does not hear the verdict');
});

test('without .provide() the first write fails loudly, naming the action', () => {
  const actor = createActor(coordinatorMachine, { input: input() });
  const errors: Error[] = [];
  actor.subscribe({ error: (e) => errors.push(e as Error) });
  actor.start();
  actor.send(join(0, 0));
  assert.is(errors.length, 1);
  assert.match(errors[0]!.message, /"send" action was not provided/);
});

test.run();
