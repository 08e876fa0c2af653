// After the rank table is out: start-up stays all-or-nothing until group-ready; afterwards a lost
// node (stopped, failed, frozen, or node 0 itself) is only reported, and it can rejoin.
import { createServer } from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { encodeRdzvMessage, RDZV_PROTOCOL_VERSION } from '../../src/rendezvous/groupMessages.js';
import { Coordinator } from '../../src/rendezvous/coordinatorServer.js';
import {
  closeAll, closeLeftovers, FAST, joinRequest, RawPeer, readyGroup, silent, sleep, startCoordinator, startNodes, TestNode, track,
} from './groupHarness.js';

const three = { nnodes: 3, localWorldSize: 1 };

async function loadingGroup() {
  const coordinator = await startCoordinator(three);
  const nodes = startNodes(coordinator.port, three, [0, 1, 2]);
  for (const n of nodes) await n.next('GROUP_JOINED');
  return { coordinator, nodes };
}

test('a node failing during loading fails every node, naming it and its error', async () => {
  const { coordinator, nodes } = await loadingGroup();
  try {
    nodes[0]!.client.nodeReady();
    nodes[2]!.client.nodeFailed({ name: 'DeviceError', code: 'E_DEVICE_OOM', message: 'rank 2 (local 0) failed: out of memory' });
    for (const n of [nodes[0]!, nodes[1]!]) {
      await n.next('GROUP_FAILED');
      assert.is(n.failure().code, 'E_RDZV_PEER_FAILED');
      assert.match(n.failure().message, /^node 2 \(host2, 127\.0\.0\.1:\d+\) failed: rank 2 \(local 0\) failed: out of memory$/);
    }
    assert.not.ok(nodes[2]!.types().includes('GROUP_FAILED'), 'the failing node knows its own cause already');
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('a node vanishing during loading (no goodbye) fails every node', async () => {
  const coordinator = await startCoordinator(three);
  const nodes = startNodes(coordinator.port, three, [0, 1]);
  const doomed = new RawPeer(coordinator.port);
  const beat = setInterval(() => doomed.send({ type: 'heartbeat' }), 30);
  try {
    const hello = await doomed.hello();
    doomed.send({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, ...joinRequest(three, 2), tokenProof: null });
    void hello;
    for (const n of nodes) await n.next('GROUP_JOINED');
    doomed.socket.destroy();
    for (const n of nodes) {
      await n.next('GROUP_FAILED');
      assert.is(n.failure().code, 'E_RDZV_PEER_LOST', n.failure().message);
      assert.match(n.failure().message, /^node 2 \(host2, .*\) disconnected before the group was ready \((connection closed by the peer|connection error \(ECONNRESET\))\); start-up is all-or-nothing/);
    }
  } finally {
    clearInterval(beat);
    closeAll(coordinator, nodes);
  }
});

test('node 0 vanishing during loading fails every node', async () => {
  const { coordinator, nodes } = await loadingGroup();
  try {
    coordinator.close();
    for (const n of nodes.slice(1)) {
      await n.next('GROUP_FAILED');
      assert.is(n.failure().code, 'E_RDZV_COORDINATOR_LOST');
      assert.match(n.failure().message, /^lost the connection to node 0 at 127\.0\.0\.1:\d+ before the group was ready \(node 0 said: node 0 stopped\)/);
    }
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('a node stopping while serving is reported; it rejoins and the others see it back', async () => {
  const { coordinator, nodes } = await readyGroup(three);
  try {
    nodes[1]!.client.close();
    for (const n of [nodes[0]!, nodes[2]!]) {
      const lost = await n.next('PEER_LOST');
      assert.equal(lost, { type: 'PEER_LOST', nodeRank: 1, reason: 'left: node stopped' });
    }
    assert.is(coordinator.phase, 'serving');
    const again = new TestNode(coordinator.port, joinRequest(three, 1, { hostName: 'host1-new' }));
    nodes.push(again);
    const joined = await again.next('GROUP_JOINED');
    assert.is(joined.rankTable[1]!.hostName, 'host1-new');
    await sleep(50);
    assert.not.ok(nodes[0]!.types().includes('PEER_BACK:1'), 'back only once it serves again');
    again.client.nodeReady();
    await again.next('GROUP_READY');
    for (const n of [nodes[0]!, nodes[2]!]) {
      await n.next('PEER_BACK');
      assert.equal(n.types(), ['GROUP_JOINED', 'GROUP_READY', 'PEER_LOST:1', 'PEER_BACK:1']);
    }
    assert.equal(again.types(), ['GROUP_JOINED', 'GROUP_READY']);
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('a node failing while serving is reported with its error; a rejoiner learns who is still down', async () => {
  const { coordinator, nodes } = await readyGroup(three);
  try {
    nodes[2]!.client.nodeFailed({ name: 'RankFailedError', code: 'E_RANK', message: 'rank 2 exited' });
    await nodes[0]!.next('PEER_LOST', 2000, (e) => e.nodeRank === 2);
    assert.is((await nodes[1]!.next('PEER_LOST')).reason, 'failed: rank 2 exited');
    nodes[1]!.client.close();
    await nodes[0]!.next('PEER_LOST', 2000, (e) => e.nodeRank === 1);
    const again = new TestNode(coordinator.port, joinRequest(three, 1));
    nodes.push(again);
    await again.next('GROUP_JOINED');
    again.client.nodeReady();
    await again.next('PEER_LOST');
    assert.equal(again.types(), ['GROUP_JOINED', 'GROUP_READY', 'PEER_LOST:2']);
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('while serving, a second node with a live node rank is refused alone', async () => {
  const { coordinator, nodes } = await readyGroup(three);
  const twin = new TestNode(coordinator.port, joinRequest(three, 2, { deviceUuids: ['other'] }));
  try {
    await twin.next('GROUP_FAILED');
    assert.is(twin.failure().code, 'E_RDZV_DUPLICATE_NODE_RANK');
    await sleep(100);
    for (const n of nodes) assert.equal(n.types(), ['GROUP_JOINED', 'GROUP_READY']);
    assert.is(coordinator.phase, 'serving');
  } finally {
    closeAll(coordinator, [...nodes, twin]);
  }
});

test('a frozen node is lost after the peer timeout, not at its next heartbeat', async () => {
  const coordinator = await startCoordinator(three);
  const nodes = startNodes(coordinator.port, three, [0, 1]);
  const frozen = new RawPeer(coordinator.port);
  let beat: NodeJS.Timeout | undefined = setInterval(() => frozen.send({ type: 'heartbeat' }), FAST.heartbeatMs);
  try {
    await frozen.hello();
    frozen.send({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, ...joinRequest(three, 2), tokenProof: null });
    for (const n of nodes) await n.next('GROUP_JOINED');
    frozen.send({ type: 'ready' });
    for (const n of nodes) n.client.nodeReady();
    for (const n of nodes) await n.next('GROUP_READY');
    clearInterval(beat);
    beat = undefined;
    const stoppedAt = Date.now();
    const lost = await nodes[0]!.next('PEER_LOST');
    const after = Date.now() - stoppedAt;
    assert.is(lost.nodeRank, 2);
    assert.match(lost.reason, new RegExp(`^no message for \\d+ ms \\(peer timeout ${FAST.peerTimeoutMs} ms\\)`));
    // Never before the timeout; how long after it is up to the scheduler.
    assert.ok(after >= FAST.peerTimeoutMs - FAST.heartbeatMs, `lost after ${after} ms`);
  } finally {
    if (beat) clearInterval(beat);
    frozen.socket.destroy();
    closeAll(coordinator, nodes);
  }
});

test('a frozen node 0 is reported by the others, who keep serving', async () => {
  // A coordinator that forms a one-node group and then falls silent.
  const server = createServer((s) => {
    s.on('error', () => {});
    s.write(encodeRdzvMessage({ type: 'hello', protocolVersion: RDZV_PROTOCOL_VERSION, nonce: 'n'.repeat(32) }));
    s.write(encodeRdzvMessage({ type: 'joined', rankTable: [{ globalRank: 0, nodeRank: 1, localRank: 0, hostName: 'h', deviceUuid: 'd' }] }));
    s.write(encodeRdzvMessage({ type: 'group_ready', lost: [] }));
  }).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  const node = new TestNode((server.address() as { port: number }).port, joinRequest({ nnodes: 2, localWorldSize: 1 }, 1));
  try {
    node.client.nodeReady();
    const lost = await node.next('PEER_LOST', 2000);
    assert.is(lost.nodeRank, 0);
    assert.match(lost.reason, /^connection to node 0 lost \(no message for \d+ ms/);
    assert.equal(node.types(), ['GROUP_JOINED', 'GROUP_READY', 'PEER_LOST:0']);
  } finally {
    node.client.close();
    server.close();
  }
});

test('node 0 dying while serving: the others report it, keep serving, and rejoin a restarted node 0', async () => {
  const { coordinator, nodes } = await readyGroup(three);
  const port = coordinator.port;
  let fresh: Awaited<ReturnType<typeof startCoordinator>> | undefined;
  try {
    coordinator.close();
    nodes[0]!.client.close();
    for (const n of nodes.slice(1)) {
      const lost = await n.next('PEER_LOST');
      assert.equal(lost, { type: 'PEER_LOST', nodeRank: 0, reason: 'connection to node 0 lost (node 0 said: node 0 stopped)' });
    }
    // The survivors are trying to reach a node 0 that is not there yet.
    for (const n of nodes.slice(1)) await n.logged(/^reconnecting to node 0 at .* in the background$/);
    fresh = await startCoordinator(three, port);
    const node0 = new TestNode(port, joinRequest(three, 0));
    nodes.push(node0);
    await node0.next('GROUP_JOINED');
    await sleep(50);
    assert.not.ok(nodes[1]!.types().includes('PEER_BACK:0'), 'back once the new group is ready');
    node0.client.nodeReady();
    await node0.next('GROUP_READY');
    for (const n of nodes.slice(1, 3)) {
      await n.next('PEER_BACK');
      assert.equal(n.types(), ['GROUP_JOINED', 'GROUP_READY', 'PEER_LOST:0', 'PEER_BACK:0']);
    }
    assert.is(fresh.phase, 'serving');
  } finally {
    closeAll(fresh, nodes);
  }
});

test('a restarted node 0 with another checkpoint: the survivors keep serving and keep trying', async () => {
  const { coordinator, nodes } = await readyGroup({ nnodes: 2, localWorldSize: 1 });
  const port = coordinator.port;
  let fresh: Awaited<ReturnType<typeof startCoordinator>> | undefined;
  try {
    coordinator.close();
    nodes[0]!.client.close();
    await nodes[1]!.next('PEER_LOST');
    fresh = track(await Coordinator.listen({
      host: '127.0.0.1', port, expect: { nnodes: 2, tpSize: 2, localWorldSize: 1, fingerprint: 'c'.repeat(64) }, rendezvousTimeoutMs: 5000, timing: FAST, log: silent,
    }));
    // It tried the new node 0 and was refused, and keeps serving.
    await nodes[1]!.logged(/^node 0 refused this node's rejoin \(retrying\): /);
    assert.equal(nodes[1]!.types(), ['GROUP_JOINED', 'GROUP_READY', 'PEER_LOST:0']);
  } finally {
    closeAll(fresh, nodes);
  }
});

test.after.each(closeLeftovers);
test.run();
