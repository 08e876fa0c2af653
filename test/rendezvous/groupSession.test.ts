// The actor the supervisor spawns: no network for a single node; node 0 hosting the
// coordinator and joining it over TCP; a local failure reaching the other nodes before node 0's
// process could end; and the clocks' validation.
import { freePort } from '../../src/nodeOptions.js';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor } from 'xstate';
import { groupSession } from '../../src/actors/groupSession.js';
import type { Prepared } from '../../src/machines/supervisorActors.js';
import type { GroupEvent } from '../../src/rendezvous/groupEvents.js';
import { groupTiming } from '../../src/rendezvous/timing.js';
import { fakeConfig, fakePrepared } from '../helpers/fakeNode.js';
import { FAST, silent, sleep, closeLeftovers, track } from './groupHarness.js';


function prepared(nodeRank: number): Prepared {
  return { ...fakePrepared, devices: fakePrepared.devices.map((d) => ({ ...d, uuid: `n${nodeRank}-${d.uuid}` })) };
}

/** Runs the actor under a tiny parent that records what it sends back. */
async function withParent(nodeRank: number, nnodes: number, port: number, over: Partial<ReturnType<typeof fakeConfig>> = {}) {
  const { setup } = await import('xstate');
  const lws = fakePrepared.devices.length;
  const events: GroupEvent[] = [];
  const parent = setup({ actors: { groupSession }, types: { events: {} as GroupEvent | { type: 'CMD'; cmd: { type: 'NODE_READY' } | { type: 'NODE_FAILED'; error: { name: string; code: string; message: string } } } } }).createMachine({
    invoke: {
      id: 'group',
      src: 'groupSession',
      input: {
        config: fakeConfig({ nnodes, nodeRank, tpSize: nnodes * lws, localWorldSize: lws, weightCachePort: port, rendezvousTimeoutMs: 3000, ...over }),
        prepared: prepared(nodeRank),
        log: silent,
        timing: FAST,
      },
    },
    on: {
      '*': {
        actions: [
          ({ event }) => void (event.type !== 'CMD' && events.push(event)),
          ({ event, self }) => {
            if (event.type === 'CMD') (self.getSnapshot().children as Record<string, { send: (e: unknown) => void }>).group!.send(event.cmd);
          },
        ],
      },
    },
  });
  const actor = createActor(parent);
  track({ close: () => actor.stop() });
  actor.start();
  const next = async (type: GroupEvent['type'], ms = 3000) => {
    const until = Date.now() + ms;
    while (Date.now() < until) {
      const e = events.find((x) => x.type === type);
      if (e) return e;
      await sleep(5);
    }
    throw new Error(`no ${type}; got ${JSON.stringify(events.map((e) => e.type))}`);
  };
  return { actor, events, next, send: (cmd: { type: 'NODE_READY' } | { type: 'NODE_FAILED'; error: { name: string; code: string; message: string } }) => actor.send({ type: 'CMD', cmd }) };
}

test('a single node joins at once with its own table and is group-ready after NODE_READY, without a socket', async () => {
  const node = await withParent(0, 1, 1);
  try {
    const joined = await node.next('GROUP_JOINED');
    assert.equal(joined.type === 'GROUP_JOINED' && joined.rankTable.map((e) => [e.globalRank, e.deviceUuid]), [[0, 'n0-fake-0'], [1, 'n0-fake-1']]);
    assert.equal(node.events.map((e) => e.type), ['GROUP_JOINED']);
    node.send({ type: 'NODE_READY' });
    await node.next('GROUP_READY');
  } finally {
    node.actor.stop();
  }
});

test('a single node with one device listed twice fails before loading', async () => {
  const twice: Prepared = { ...fakePrepared, devices: fakePrepared.devices.map((d) => ({ ...d, uuid: 'same' })) };
  const events: GroupEvent[] = [];
  let arrived!: () => void;
  const first = new Promise<void>((r) => (arrived = r));
  const { setup } = await import('xstate');
  const actor = createActor(
    setup({ actors: { groupSession }, types: { events: {} as GroupEvent } }).createMachine({
      invoke: { src: 'groupSession', input: { config: fakeConfig(), prepared: twice, log: silent } },
      on: { '*': { actions: ({ event }) => (events.push(event), arrived()) } },
    }),
  ).start();
  await first;
  actor.stop();
  assert.is(events[0]?.type, 'GROUP_FAILED');
  assert.is(events[0]?.type === 'GROUP_FAILED' && events[0].error.code, 'E_RDZV_DUPLICATE_DEVICE');
});

test('two nodes: node 0 hosts the coordinator and both form the group over TCP', async () => {
  const port = await freePort();
  const nodes = [await withParent(0, 2, port), await withParent(1, 2, port)];
  try {
    for (const n of nodes) {
      const joined = await n.next('GROUP_JOINED');
      assert.equal(joined.type === 'GROUP_JOINED' && joined.rankTable.map((e) => `${e.globalRank}:${e.nodeRank}/${e.localRank}`), ['0:0/0', '1:0/1', '2:1/0', '3:1/1']);
    }
    for (const n of nodes) n.send({ type: 'NODE_READY' });
    for (const n of nodes) await n.next('GROUP_READY');
  } finally {
    for (const n of nodes) n.actor.stop();
  }
});

test("node 0's own load failure reaches node 1 even though node 0 stops at once", async () => {
  const port = await freePort();
  const nodes = [await withParent(0, 2, port), await withParent(1, 2, port)];
  try {
    for (const n of nodes) await n.next('GROUP_JOINED');
    nodes[0]!.send({ type: 'NODE_FAILED', error: { name: 'DeviceError', code: 'E_DEVICE', message: 'rank 0 (local 0) failed: no memory' } });
    // What the supervisor does next: it ends, stopping the session synchronously.
    nodes[0]!.actor.stop();
    const failed = await nodes[1]!.next('GROUP_FAILED');
    assert.is(failed.type === 'GROUP_FAILED' && failed.error.code, 'E_RDZV_PEER_FAILED');
    assert.match(failed.type === 'GROUP_FAILED' ? failed.error.message : '', /^node 0 \(.*\) failed: rank 0 \(local 0\) failed: no memory$/);
  } finally {
    for (const n of nodes) n.actor.stop();
  }
});

test('node 0 holds its own GROUP_FAILED until every node has heard the verdict', async () => {
  const port = await freePort();
  const node0 = await withParent(0, 3, port, { rendezvousTimeoutMs: 1500 });
  const node1 = await withParent(1, 3, port, { tpSize: 9, localWorldSize: 3 } as never);
  const started = Date.now();
  let node2: Awaited<ReturnType<typeof withParent>> | undefined;
  try {
    await node1.next('GROUP_FAILED');
    await sleep(200);
    assert.not.ok(node0.events.some((e) => e.type === 'GROUP_FAILED'), 'node 0 waits for node 2');
    node2 = await withParent(2, 3, port);
    await node2.next('GROUP_FAILED');
    await node0.next('GROUP_FAILED');
    assert.ok(Date.now() - started < 1400, 'and not for the whole timeout once everyone heard');
  } finally {
    for (const n of [node0, node1, node2]) n?.actor.stop();
  }
});

test('node 0 that cannot listen fails with the address and the fix', async () => {
  const node0 = await withParent(0, 2, 1, { masterAddr: '192.0.2.7' });
  try {
    const failed = await node0.next('GROUP_FAILED');
    assert.is(failed.type === 'GROUP_FAILED' && failed.error.code, 'E_RDZV_LISTEN');
  } finally {
    node0.actor.stop();
  }
});

test('rendezvous clocks: defaults, environment overrides, and refused values', () => {
  assert.equal(groupTiming({}, {}), { heartbeatMs: 1000, peerTimeoutMs: 5000, retryMinMs: 100, retryMaxMs: 2000, handshakeMs: 10_000, joinMs: 2000 });
  assert.is(groupTiming({}, { WEIGHTD_RDZV_HEARTBEAT_MS: '100', WEIGHTD_RDZV_PEER_TIMEOUT_MS: '500' }).peerTimeoutMs, 500);
  assert.throws(() => groupTiming({}, { WEIGHTD_RDZV_HEARTBEAT_MS: 'fast' }), /WEIGHTD_RDZV_HEARTBEAT_MS="fast": must be a whole number of milliseconds/);
  assert.throws(() => groupTiming({}, { WEIGHTD_RDZV_PEER_TIMEOUT_MS: '1500' }), /must exceed twice WEIGHTD_RDZV_HEARTBEAT_MS 1000/);
});

test.after.each(closeLeftovers);
test.run();
