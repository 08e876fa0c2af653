// Forming a group over loopback, in-process: the rank table, the ready barrier, and every way a
// group can refuse to form, each verdict reaching every node.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createServer } from 'node:net';
import { encodeRdzvMessage, RDZV_PROTOCOL_VERSION, type AnyMessage } from '../../src/rendezvous/groupMessages.js';
import { Coordinator } from '../../src/rendezvous/coordinatorServer.js';
import { reportStartupFailure } from '../../src/rendezvous/startupFailureReport.js';
import { freePort } from '../../src/nodeOptions.js';
import {
  closeAll, closeLeftovers, FAST, FINGERPRINT, joinRequest, RawPeer, readyGroup, silent, sleep, startCoordinator, startNodes, TestNode, type GroupShape,
} from './groupHarness.js';

test('four nodes of two ranks: one global rank table on every node, then group-ready', async () => {
  const { coordinator, nodes } = await readyGroup({ nnodes: 4, localWorldSize: 2 });
  try {
    for (const n of nodes) {
      const joined = await n.next('GROUP_JOINED');
      assert.equal(joined.rankTable.map((e) => e.globalRank), [0, 1, 2, 3, 4, 5, 6, 7]);
      assert.equal(joined.rankTable[5], { globalRank: 5, nodeRank: 2, localRank: 1, hostName: 'host2', deviceUuid: 'dev-2-1' });
      assert.equal(n.types(), ['GROUP_JOINED', 'GROUP_READY']);
    }
    assert.is(coordinator.phase, 'serving');
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('while nodes are missing, joined nodes hear who is in and who is not; the coordinator moves through its phases', async () => {
  const shape = { nnodes: 3, localWorldSize: 1 };
  const coordinator = await startCoordinator(shape);
  const states: string[] = [];
  coordinator.onStateChange((s) => states.push(s));
  const nodes = startNodes(coordinator.port, shape, [0]);
  try {
    await nodes[0]!.logged(/waiting for node ranks 1, 2$/);
    assert.equal(nodes[0]!.waiting, [{ type: 'GROUP_WAITING', joined: [0], missing: [1, 2] }]);
    nodes.push(...startNodes(coordinator.port, shape, [2]));
    await nodes[1]!.logged(/waiting for node rank 1$/);
    await nodes[0]!.logged(/waiting for node rank 1$/);
    for (const n of nodes) assert.equal(n.waiting.at(-1), { type: 'GROUP_WAITING', joined: [0, 2], missing: [1] });
    nodes.push(...startNodes(coordinator.port, shape, [1]));
    for (const n of nodes) await n.next('GROUP_JOINED');
    assert.equal(nodes[2]!.waiting, [], 'the last node to join goes straight to the rank table');
    for (const n of nodes) n.client.nodeReady();
    for (const n of nodes) await n.next('GROUP_READY');
    assert.equal(states, ['gathering', 'loading', 'serving']);
    coordinator.close();
    assert.equal(states.at(-1), 'closed');
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('group-ready waits for the last node to report ready', async () => {
  const shape = { nnodes: 3, localWorldSize: 1 };
  const coordinator = await startCoordinator(shape);
  const nodes = startNodes(coordinator.port, shape, [2, 0, 1]);
  try {
    for (const n of nodes) await n.next('GROUP_JOINED');
    nodes[0]!.client.nodeReady();
    nodes[1]!.client.nodeReady();
    await sleep(100);
    assert.ok(nodes.every((n) => !n.types().includes('GROUP_READY')), 'nobody is group-ready while node 1 loads');
    nodes[2]!.client.nodeReady();
    for (const n of nodes) await n.next('GROUP_READY');
  } finally {
    closeAll(coordinator, nodes);
  }
});

// A short timeout: a duplicate node rank leaves one rank unclaimed, and node 0 waits for it to hear the verdict.
const shape: GroupShape = { nnodes: 3, localWorldSize: 2, rendezvousTimeoutMs: 1000 };
const rejections: Array<[string, (r: number) => Partial<ReturnType<typeof joinRequest>>, string, RegExp]> = [
  ['a duplicate node rank', (r) => (r === 2 ? { nodeRank: 1 } : {}), 'E_RDZV_DUPLICATE_NODE_RANK', /--node-rank 1 is claimed by two nodes/],
  ['unequal nnodes', (r) => (r === 2 ? { nnodes: 4 } : {}), 'E_RDZV_NNODES_MISMATCH', /node 2 \(host2, 127\.0\.0\.1:\d+\): --nnodes 4 differs from node 0's 3/],
  ['unequal tp', (r) => (r === 1 ? { tpSize: 3 } : {}), 'E_RDZV_TP_MISMATCH', /node 1 .*--tensor-parallel-size 3 differs from node 0's 6/],
  ['a non-uniform node', (r) => (r === 1 ? { visibleDevices: 4 } : {}), 'E_RDZV_DEVICE_COUNT', /node 1 .* sees 4 devices, but every node must see exactly .* = 2/],
  ['a duplicate device UUID', (r) => (r === 2 ? { deviceUuids: ['dev-2-0', 'dev-0-1'] } : {}), 'E_RDZV_DUPLICATE_DEVICE', /device dev-0-1 is claimed by node 0 .* local rank 1 and by node 2 .* local rank 1/],
  ['a different fingerprint', (r) => (r === 2 ? { fingerprint: 'b'.repeat(64) } : {}), 'E_RDZV_FINGERPRINT_MISMATCH', /node 2 .*checkpoint fingerprint "b{64}" differs from node 0's "a{64}"/],
];

for (const [what, over, code, message] of rejections) {
  test(`${what}: every node fails with the same verdict`, async () => {
    const coordinator = await startCoordinator(shape);
    // The odd node comes last, so the others are already waiting when it is refused.
    const nodes = startNodes(coordinator.port, shape, [0, 1], over);
    // (Node 1 may be the odd one and be refused: only node 0 is sure to be waiting.)
    await nodes[0]!.logged(/^joined the group at .*; waiting for node rank/);
    nodes.push(...startNodes(coordinator.port, shape, [2], over));
    try {
      for (const n of nodes) {
        await n.next('GROUP_FAILED');
        assert.is(n.failure().code, code);
        assert.match(n.failure().message, message);
        assert.not.ok(n.types().includes('GROUP_JOINED'), 'nobody loads');
      }
      await coordinator.verdictDelivered();
      assert.is(coordinator.phase, 'failed');
    } finally {
      closeAll(coordinator, nodes);
    }
  });
}

test('a wrong token is turned away alone: it cannot fail the group, which forms with the right one', async () => {
  const guarded = { nnodes: 2, localWorldSize: 1, token: 'right' };
  const coordinator = await startCoordinator(guarded);
  const good = new TestNode(coordinator.port, joinRequest(guarded, 0), { token: 'right' });
  await good.logged(/^joined the group at /);
  const bad = new TestNode(coordinator.port, joinRequest(guarded, 1), { token: 'wrong' });
  const stranger = new TestNode(coordinator.port, joinRequest(guarded, 1), { token: undefined });
  let late: TestNode | undefined;
  try {
    for (const n of [bad, stranger]) {
      await n.next('GROUP_FAILED');
      assert.is(n.failure().code, 'E_RDZV_TOKEN');
    }
    assert.match(bad.failure().message, /presented a wrong --weight-cache-token/);
    assert.not.match(bad.failure().message, /fingerprint|host0/, 'a refused node learns nothing about the group');
    assert.is.not(coordinator.phase, 'failed', 'the group is not failed by a node without the token');
    assert.not.ok(good.types().includes('GROUP_FAILED'));
    late = new TestNode(coordinator.port, joinRequest(guarded, 1), { token: 'right' });
    await good.next('GROUP_JOINED');
    await late.next('GROUP_JOINED');
  } finally {
    closeAll(coordinator, [good, bad, stranger, ...(late ? [late] : [])]);
  }
});

test('with a token, the timeout names the nodes that were turned away', async () => {
  const guarded = { nnodes: 2, localWorldSize: 1, token: 'right', rendezvousTimeoutMs: 600 };
  const coordinator = await startCoordinator(guarded);
  // Node 0's own clock is longer, so the coordinator's verdict is what it hears.
  const good = new TestNode(coordinator.port, joinRequest(guarded, 0), { token: 'right', rendezvousTimeoutMs: 5000 });
  const bad = new TestNode(coordinator.port, joinRequest(guarded, 1), { token: 'wrong' });
  try {
    await good.next('GROUP_FAILED', 5000);
    assert.is(good.failure().code, 'E_RDZV_TIMEOUT');
    assert.match(good.failure().message, /node rank 1 never joined .*turned away: node 1 .*\(E_RDZV_TOKEN\)/);
  } finally {
    closeAll(coordinator, [good, bad]);
  }
});

test("a stranger's flood of joins without the token: the timeout verdict names a few, counts the rest, and still reaches every node", async () => {
  const guarded = { nnodes: 2, localWorldSize: 1, token: 'right', rendezvousTimeoutMs: 800 };
  const coordinator = await startCoordinator(guarded);
  const good = new TestNode(coordinator.port, joinRequest(guarded, 0), { token: 'right', rendezvousTimeoutMs: 5000 });
  const stranger = new RawPeer(coordinator.port);
  try {
    await stranger.hello();
    // Each a distinct node rank: before the bound, each was named in the verdict, which grew past
    // what a node reads (2000 characters) and reached no node as the timeout.
    const joins = Array.from({ length: 2000 }, (_, i) => encodeRdzvMessage({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, ...joinRequest(guarded, 1 + (i % 4000)), tokenProof: null } as AnyMessage));
    stranger.socket.write(Buffer.concat(joins));
    await good.next('GROUP_FAILED', 5000);
    const { code, message } = good.failure();
    assert.is(code, 'E_RDZV_TIMEOUT');
    assert.match(message, /turned away: node 1 .*\(E_RDZV_TOKEN\).* \((\d+) joins turned away in all\)/);
    assert.ok((message.match(/\(E_RDZV_TOKEN\)/g) ?? []).length <= 8, message);
    assert.ok(Number(/\((\d+) joins turned away in all\)/.exec(message)![1]) > 8, message);
  } finally {
    closeAll(coordinator, [good]);
    stranger.close();
  }
});

test('a node of another protocol version is refused by name on every node', async () => {
  const two = { nnodes: 2, localWorldSize: 1 };
  const coordinator = await startCoordinator(two);
  const node0 = new TestNode(coordinator.port, joinRequest(two, 0));
  const future = new RawPeer(coordinator.port);
  try {
    await future.hello();
    future.send({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION + 1, nodeRank: 1, hostName: 'newer', shiny: [1, 2] });
    await node0.next('GROUP_FAILED');
    assert.is(node0.failure().code, 'E_RDZV_VERSION_MISMATCH');
    assert.match(node0.failure().message, new RegExp(`node 1 \\(newer, 127\\.0\\.0\\.1:\\d+\\) speaks rendezvous protocol version ${RDZV_PROTOCOL_VERSION + 1}, node 0 speaks ${RDZV_PROTOCOL_VERSION}`));
    await future.closed;
    const verdict = future.received.find((m) => m.type === 'rejected');
    assert.is(verdict?.type === 'rejected' && verdict.code, 'E_RDZV_VERSION_MISMATCH', 'the newer node hears it too');
  } finally {
    closeAll(coordinator, [node0]);
  }
});

test('a peer speaking another protocol is dropped, and the group still forms', async () => {
  const two = { nnodes: 2, localWorldSize: 1 };
  const coordinator = await startCoordinator(two);
  const http = new RawPeer(coordinator.port);
  http.socket.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
  const huge = new RawPeer(coordinator.port);
  const header = Buffer.from('WGTD\0\x01\xff\xff\xff\xff', 'latin1');
  huge.socket.write(header);
  const schema = new RawPeer(coordinator.port);
  schema.send({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, nodeRank: 'one' });
  const early = new RawPeer(coordinator.port);
  early.send({ type: 'ready' });
  await Promise.all([http.closed, huge.closed, schema.closed, early.closed]);
  const nodes = startNodes(coordinator.port, two, [0, 1]);
  try {
    for (const n of nodes) await n.next('GROUP_JOINED');
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('a connection that never joins is dropped after the handshake time', async () => {
  const two = { nnodes: 2, localWorldSize: 1 };
  const coordinator = await startCoordinator(two);
  const mute = new RawPeer(coordinator.port);
  // It answers heartbeats, so only the handshake deadline can end it.
  const beat = setInterval(() => mute.send({ type: 'heartbeat' }), 30);
  const started = Date.now();
  try {
    await mute.closed;
    const took = Date.now() - started;
    assert.ok(took >= 900 && took < 3000, `closed after ${took} ms`);
  } finally {
    clearInterval(beat);
    closeAll(coordinator, []);
  }
});

test('a node that never arrives: after the timeout every node fails naming it', async () => {
  const late = { nnodes: 4, localWorldSize: 1, rendezvousTimeoutMs: 600 };
  const coordinator = await startCoordinator(late);
  const nodes = startNodes(coordinator.port, late, [0, 2]);
  const started = Date.now();
  try {
    for (const n of nodes) {
      await n.next('GROUP_FAILED');
      assert.is(n.failure().code, 'E_RDZV_TIMEOUT');
      assert.match(n.failure().message, /node ranks 1, 3 never joined \(joined: 0, 2\)/);
    }
    assert.ok(Date.now() - started < 2000);
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('a late node still hears why a failed group failed', async () => {
  const three = { nnodes: 3, localWorldSize: 1, rendezvousTimeoutMs: 3000 };
  const coordinator = await startCoordinator(three);
  const nodes = startNodes(coordinator.port, three, [0, 1], (r) => (r === 1 ? { tpSize: 9 } : {}));
  try {
    for (const n of nodes) await n.next('GROUP_FAILED');
    let delivered = false;
    void coordinator.verdictDelivered().then(() => (delivered = true));
    await sleep(100);
    assert.not.ok(delivered, 'node 2 has not heard yet');
    const late = new TestNode(coordinator.port, joinRequest(three, 2));
    nodes.push(late);
    await late.next('GROUP_FAILED');
    assert.is(late.failure().code, 'E_RDZV_TP_MISMATCH');
    assert.match(late.failure().message, /node 1 .*--tensor-parallel-size 9/);
    await coordinator.verdictDelivered();
  } finally {
    closeAll(coordinator, nodes);
  }
});

test('nodes that start before node 0 retry until it listens', async () => {
  const two = { nnodes: 2, localWorldSize: 1 };
  // Learn a free port, then leave it closed for a while.
  const port = await freePort();
  const node1 = new TestNode(port, joinRequest(two, 1));
  await node1.logged(/^node 0 not reachable yet; retrying$/);
  const coordinator = await startCoordinator(two, port);
  const node0 = new TestNode(port, joinRequest(two, 0));
  try {
    await node1.next('GROUP_JOINED');
    await node0.next('GROUP_JOINED');
  } finally {
    closeAll(coordinator, [node0, node1]);
  }
});

test('node 0 never listening: the timeout says where this node looked and the last error', async () => {
  const node1 = new TestNode(1, joinRequest({ nnodes: 2, localWorldSize: 1 }, 1), { rendezvousTimeoutMs: 400 });
  try {
    await node1.next('GROUP_FAILED');
    assert.is(node1.failure().code, 'E_RDZV_TIMEOUT');
    assert.match(node1.failure().message, /node 0 at 127\.0\.0\.1:1 never answered \(last attempt: connection error \(ECONNREFUSED\)\); start node 0 with --node-rank 0/);
  } finally {
    node1.client.close();
  }
});

test('something else on the port: the node fails at once, saying so', async () => {
  const other = createServer((s) => s.end('SSH-2.0-OpenSSH\r\n')).listen(0, '127.0.0.1');
  await new Promise((r) => other.once('listening', r));
  const node1 = new TestNode((other.address() as { port: number }).port, joinRequest({ nnodes: 2, localWorldSize: 1 }, 1));
  try {
    await node1.next('GROUP_FAILED', 1000);
    assert.is(node1.failure().code, 'E_RDZV_NOT_WEIGHTD');
    assert.match(node1.failure().message, /does not speak the weightd rendezvous protocol .*check --master-addr/);
  } finally {
    node1.client.close();
    other.close();
  }
});

test('the coordinator cannot listen on a port in use or an address not its own', async () => {
  const a = await startCoordinator({ nnodes: 2, localWorldSize: 1 });
  try {
    await startCoordinator({ nnodes: 2, localWorldSize: 1 }, a.port).then(() => assert.unreachable(), (err) => {
      assert.is(err.code, 'E_RDZV_LISTEN');
      assert.match(err.message, /cannot listen for the rendezvous on 127\.0\.0\.1:\d+ \(EADDRINUSE\): .*pick a free --weight-cache-master-port/);
    });
  } finally {
    a.close();
  }
  await Coordinator.listen({
    host: '192.0.2.1', port: 0, expect: { nnodes: 2, tpSize: 2, localWorldSize: 1, fingerprint: FINGERPRINT }, rendezvousTimeoutMs: 1000,
    timing: FAST, log: silent,
  }).then(() => assert.unreachable(), (err) => {
    assert.is(err.code, 'E_RDZV_LISTEN');
    assert.match(err.message, /\(EADDRNOTAVAIL\): node 0 listens on --master-addr/);
  });
});

test.after.each(closeLeftovers);

test('a node that failed before joining fails the starting group at once, naming it; without the token it cannot', async () => {
  const guarded = { nnodes: 2, localWorldSize: 1, token: 'right' };
  const coordinator = await startCoordinator(guarded);
  const node0 = new TestNode(coordinator.port, joinRequest(guarded, 0), { token: 'right' });
  const error = { name: 'CheckpointError', code: 'E_ST_TRUNCATED', message: 'model-00001.safetensors is truncated' };
  const report = (token: string | undefined) =>
    reportStartupFailure({ host: '127.0.0.1', port: coordinator.port, token, nodeRank: 1, hostName: 'host1', error, timing: FAST, timeoutMs: 2000 });
  try {
    await node0.logged(/^joined the group at .*; waiting for node rank 1$/);
    assert.is(await report('wrong'), true, 'sent');
    await sleep(100);
    assert.is.not(coordinator.phase, 'failed', 'a report without the token changes nothing');
    assert.is(await report('right'), true);
    await node0.next('GROUP_FAILED');
    assert.is(node0.failure().code, 'E_RDZV_PEER_FAILED');
    assert.match(node0.failure().message, /^node 1 \(host1, .*\) failed before joining: E_ST_TRUNCATED: model-00001\.safetensors is truncated/);
  } finally {
    closeAll(coordinator, [node0]);
  }
});

test('a failure report to a node 0 that is not up comes back false, in bounded time', async () => {
  const port = await freePort();
  const t0 = Date.now();
  const sent = await reportStartupFailure({ host: '127.0.0.1', port, nodeRank: 1, hostName: 'h', error: { name: 'E', code: 'E_X', message: 'x' }, timing: FAST, timeoutMs: 1000 });
  assert.is(sent, false);
  assert.ok(Date.now() - t0 < 1500);
});

test.run();
