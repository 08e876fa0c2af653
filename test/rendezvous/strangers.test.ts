// Anyone who can reach the coordinator's port can open connections and never join. They get a
// bounded budget of their own, and a full budget evicts the oldest connection of the address
// holding the most, so strangers cannot keep real nodes out: 1,000 idle connections held
// during formation, and a trickle of new ones throughout, with a token and without.
import { connect, type Socket } from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { PENDING_BUDGET } from '../../src/rendezvous/coordinatorServer.js';
import { encodeRdzvMessage } from '../../src/rendezvous/groupMessages.js';
import { closeAll, closeLeftovers, joinRequest, startCoordinator, TestNode, track, type GroupShape } from './groupHarness.js';

// The strangers' connections are held as long as a real coordinator's old 10 s handshake
// would have held them, past the rendezvous timeout, so only the budget can let nodes in.
// Real heartbeat clocks: with the harness's 50 ms, 1,000 connections in this one process
// would be load enough to starve a busy machine. The rendezvous timeout is only the bound
// within which the group must form.
const timing = { heartbeatMs: 1000, peerTimeoutMs: 60_000, handshakeMs: 60_000, joinMs: 60_000 };
const FORM_MS = 60_000;

const heartbeat = encodeRdzvMessage({ type: 'heartbeat' });

/**
 * One idle connection from another loopback address (127.0.0.2: a stranger's host). It answers
 * every frame with a heartbeat, so the peer timeout never ends it: only the join deadline does.
 */
function stranger(port: number, all: Socket[]): Promise<void> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port, localAddress: '127.0.0.2' });
    all.push(s);
    s.on('error', () => {});
    s.on('data', () => s.write(heartbeat));
    s.once('connect', () => resolve());
    s.once('close', () => resolve());
  });
}

function strangers(): { all: Socket[]; close(): void } {
  const all: Socket[] = [];
  return track({ all, close: () => all.forEach((s) => s.destroy()) });
}

for (const token of ['s3cret', undefined]) {
  const shape: GroupShape = { nnodes: 2, localWorldSize: 1, token, rendezvousTimeoutMs: FORM_MS, timing };
  const node = (port: number, rank: number) => new TestNode(port, joinRequest(shape, rank), { token, rendezvousTimeoutMs: FORM_MS, timing });

  test(`${token ? 'with' : 'without'} a token: 1,000 idle connections opened before formation do not keep two nodes from forming`, async () => {
    const coordinator = await startCoordinator(shape);
    const crowd = strangers();
    let nodes: TestNode[] = [];
    try {
      for (let i = 0; i < 1000; i += 100) await Promise.all(Array.from({ length: 100 }, () => stranger(coordinator.port, crowd.all)));
      nodes = [node(coordinator.port, 0), node(coordinator.port, 1)];
      for (const n of nodes) await n.next('GROUP_JOINED', FORM_MS);
      assert.is(coordinator.phase, 'loading');
      const open = crowd.all.filter((s) => !s.destroyed && s.readyState === 'open').length;
      assert.ok(open <= PENDING_BUDGET, `${open} strangers still held (budget ${PENDING_BUDGET})`);
    } finally {
      crowd.close();
      closeAll(coordinator, nodes);
    }
  });

  test(`${token ? 'with' : 'without'} a token: a trickle of new idle connections throughout formation does not keep nodes out`, async () => {
    const coordinator = await startCoordinator(shape);
    const crowd = strangers();
    let opened = 0;
    let halfway!: () => void;
    const manyCame = new Promise<void>((r) => (halfway = r));
    const trickle = setInterval(() => {
      if (opened++ < 1500) void stranger(coordinator.port, crowd.all);
      if (opened === PENDING_BUDGET * 2) halfway();
    }, 1);
    let nodes: TestNode[] = [];
    try {
      // Node 1 first, so it waits (pending budget full around it) while strangers keep coming.
      nodes = [node(coordinator.port, 1)];
      await manyCame;
      nodes.push(node(coordinator.port, 0));
      for (const n of nodes) await n.next('GROUP_JOINED', FORM_MS);
      assert.ok(opened > PENDING_BUDGET, `${opened} strangers came during formation`);
    } finally {
      clearInterval(trickle);
      crowd.close();
      closeAll(coordinator, nodes);
    }
  });
}

test.after.each(() => closeLeftovers());
test.run();
