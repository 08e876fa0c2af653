// The multi-node scenarios of issue 6, with real daemon processes, defined once and run on each
// fabric (network namespaces, loopback) by the e2e.*.test.ts files.
import { closeSync, cpSync, mkdtempSync, openSync, readdirSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../../src/nodeOptions.js';
import { RDZV_PROTOCOL_VERSION } from '../../src/rendezvous/groupMessages.js';
import type { Test } from 'uvu';
import * as assert from 'uvu/assert';
import type { Fabric } from '../helpers/netns.js';
import { Cluster, e2eModels, frozenPeerEnv, type Daemon, type NodeSpec } from './cluster.js';


type Models = Awaited<ReturnType<typeof e2eModels>>;

export function defineScenarios(test: Test, makeFabric: (n: number) => Fabric): void {
  let models: Models;
  test.before(async () => {
    models = await e2eModels();
  });
  test.after(() => models?.remove());

  async function withCluster(nodes: number, shape: { nnodes: number; tp: number; timeoutS?: number; env?: Record<string, string> }, body: (c: Cluster) => Promise<void>): Promise<void> {
    const fabric = makeFabric(nodes);
    // In namespaces every node has the port to itself; on loopback the nodes share one stack.
    const port = fabric.kind === 'netns' ? 29_500 : await freePort();
    const cluster = new Cluster(fabric, port, { timeoutS: 20, model: models.model, ...shape });
    try {
      await body(cluster);
    } finally {
      await cluster.close();
      fabric.close();
    }
  }

  const lost = (r: number) => new RegExp(`^node ${r} lost; this node keeps serving$`);
  const back = (r: number) => new RegExp(`^node ${r} is back and serving$`);

  async function allSee(daemons: Daemon[], pattern: RegExp, marks: number[]): Promise<void> {
    await Promise.all(daemons.map((d, i) => d.waitForMsg(pattern, marks[i])));
  }

  for (const n of [2, 3, 4]) {
    test(`${n} nodes: start, publish the rank table, serve; a node killed while serving is reported and rejoins; node 0 killed: the others keep serving and rejoin it`, async () => {
      await withCluster(n, { nnodes: n, tp: 2 * n }, async (c) => {
        const nodes = Array.from({ length: n }, (_, r) => c.start({ nodeRank: r }));
        await Promise.all(nodes.map((d) => d.groupReady()));
        const table = (await nodes[n - 1]!.waitForMsg(/^every node joined: global rank table/)).rankTable as Array<Record<string, unknown>>;
        assert.equal(
          table.map((e) => [e.globalRank, e.nodeRank, e.localRank, e.deviceUuid]),
          Array.from({ length: 2 * n }, (_, g) => [g, Math.floor(g / 2), g % 2, `node${Math.floor(g / 2)}-dev${g % 2}`]),
        );
        assert.equal((await nodes[1]!.pingAll()).sort(), [2, 3], 'node 1 serves global ranks 2 and 3');

        // Something that is not weightd dials the coordinator: dropped, nothing else happens.
        const mark0 = nodes[0]!.mark();
        await c.run(n - 1, 'rawPeer.js', ['garbage', c.fabric.addr(0), String(c.port)]).exit;
        await nodes[0]!.waitForMsg(/^dropped a rendezvous connection: frame does not start with the magic/, mark0);

        // The last node is killed while serving, then restarted.
        const last = n - 1;
        const others = nodes.slice(0, last);
        let marks = others.map((d) => d.mark());
        nodes[last]!.kill('SIGKILL');
        await allSee(others, lost(last), marks);
        marks = others.map((d) => d.mark());
        const again = c.start({ nodeRank: last });
        await again.groupReady();
        await allSee(others, back(last), marks);

        // Node 0 is killed while serving: the others report it and keep serving.
        const survivors = [...nodes.slice(1, last), again];
        marks = survivors.map((d) => d.mark());
        nodes[0]!.kill('SIGKILL');
        await allSee(survivors, lost(0), marks);
        for (const d of survivors) assert.ok((await d.pingAll()).length === 2, `node ${d.spec.nodeRank} still serves`);
        // A restarted node 0 is a fresh coordinator; the survivors rejoin it without reloading.
        marks = survivors.map((d) => d.mark());
        const node0 = c.start({ nodeRank: 0 });
        await node0.groupReady();
        await allSee(survivors, back(0), marks);
        for (const d of survivors) assert.not.ok(d.lines.slice(marks[survivors.indexOf(d)]).some((l) => l.includes('"msg":"READY')), 'survivors did not reload');

        for (const d of [node0, ...survivors]) d.kill('SIGTERM');
        for (const d of [node0, ...survivors]) assert.is((await d.exit).code, 0, `node ${d.spec.nodeRank} stops cleanly`);
      });
    });
  }

  test('a frozen node (SIGSTOP) is lost after the peer timeout; thawed, it rejoins by itself', async () => {
    // The only test that needs the heartbeat timeout: a stopped process keeps its connections.
    // Heartbeats that wait unread while a node's own thread is stalled no longer count as
    // silence (peerSocket.test), so a false loss needs a node to stall its sender for the whole
    // timeout. It runs with the default (5 s): a shorter one (2 s) saw a node that was only
    // starved of CPU on a loaded 2-core machine as lost (no message for 3.1 s during start-up).
    await withCluster(3, { nnodes: 3, tp: 6, env: frozenPeerEnv }, async (c) => {
      const nodes = Array.from({ length: 3 }, (_, r) => c.start({ nodeRank: r }));
      await Promise.all(nodes.map((d) => d.groupReady()));
      const others = nodes.slice(0, 2);
      let marks = others.map((d) => d.mark());
      nodes[2]!.kill('SIGSTOP');
      await allSee(others, lost(2), marks);
      marks = others.map((d) => d.mark());
      nodes[2]!.kill('SIGCONT');
      await allSee(others, back(2), marks);
    });
  });

  const rejections: Array<{ what: string; nnodes: number; nodes: (m: Models) => NodeSpec[]; code: string; message: RegExp }> = [
    {
      what: 'a duplicate node rank',
      nnodes: 3,
      nodes: () => [{ nodeRank: 0 }, { nodeRank: 1 }, { nodeRank: 1, on: 2, devices: ['spare-dev0', 'spare-dev1'] }],
      code: 'E_RDZV_DUPLICATE_NODE_RANK',
      message: /--node-rank 1 is claimed by two nodes, node 1 \(.*\) and node \? \(.*\); give every node a distinct --node-rank from 0 to 2/,
    },
    {
      what: 'unequal nnodes',
      nnodes: 2,
      nodes: () => [{ nodeRank: 0 }, { nodeRank: 1, nnodes: 4, tp: 4, devices: ['node1-dev0'] }],
      code: 'E_RDZV_NNODES_MISMATCH',
      message: /^node 1 \(.*\): --nnodes 4 differs from node 0's 2; pass the same --nnodes to every node$/,
    },
    {
      what: 'unequal tensor-parallel size',
      nnodes: 2,
      nodes: () => [{ nodeRank: 0 }, { nodeRank: 1, tp: 2, devices: ['node1-dev0'] }],
      code: 'E_RDZV_TP_MISMATCH',
      message: /^node 1 \(.*\): --tensor-parallel-size 2 differs from node 0's 4/,
    },
    {
      what: 'a node with more devices than tp/nnodes',
      nnodes: 2,
      nodes: () => [{ nodeRank: 0 }, { nodeRank: 1, devices: ['node1-dev0', 'node1-dev1', 'node1-dev2'] }],
      code: 'E_RDZV_DEVICE_COUNT',
      message: /^node 1 \(.*\) sees 3 devices, but every node must see exactly tensor-parallel-size \/ nnodes = 2/,
    },
    {
      what: 'a device on two nodes',
      nnodes: 2,
      nodes: () => [{ nodeRank: 0 }, { nodeRank: 1, devices: ['node1-dev0', 'node0-dev1'] }],
      code: 'E_RDZV_DUPLICATE_DEVICE',
      message: /^device node0-dev1 is claimed by node 0 \(.*\) local rank 1 and by node 1 \(.*\) local rank 1/,
    },
    {
      what: 'a different checkpoint',
      nnodes: 2,
      nodes: (m) => [{ nodeRank: 0 }, { nodeRank: 1, model: m.other }],
      code: 'E_RDZV_FINGERPRINT_MISMATCH',
      message: /^node 1 \(.*\): checkpoint fingerprint "[0-9a-f]{64}" differs from node 0's "[0-9a-f]{64}"; every node must load the same checkpoint/,
    },
  ];

  test('a wrong token fails that node at once, and the others at their timeout, naming it', async () => {
    await withCluster(2, { nnodes: 2, tp: 4, timeoutS: 4 }, async (c) => {
      const [node0, node1] = [c.start({ nodeRank: 0, token: 'alpha' }), c.start({ nodeRank: 1, token: 'beta' })];
      await node1!.failsWith('E_RDZV_TOKEN', /^node 1 \(.*\) presented a wrong --weight-cache-token/);
      // Node 0's own clock and its coordinator's run out together; either verdict names node 1.
      await node0!.failsWith('E_RDZV_TIMEOUT', /node rank 1 never joined/);
      assert.ok(node0!.logs().some((l) => /turned away a join without a valid token: node 1 /.test(String(l.msg))), 'node 0 logs who was turned away');
    });
  });

  test('a node that fails before joining (a corrupt checkpoint) fails every node at once, naming it', async () => {
    const broken = mkdtempSync(join(tmpdir(), 'weightd-e2e-broken-'));
    try {
      cpSync(models.model, broken, { recursive: true });
      const shard = readdirSync(broken).find((f) => f.endsWith('.safetensors'))!;
      // A header length of 2^40: the parser refuses the file before reading it.
      const fd = openSync(join(broken, shard), 'r+');
      writeSync(fd, Buffer.from([0, 0, 0, 0, 0, 1, 0, 0]), 0, 8, 0);
      closeSync(fd);
      // A long timeout, so only the failure report can end node 0 quickly.
      await withCluster(2, { nnodes: 2, tp: 4, timeoutS: 120 }, async (c) => {
        const node0 = c.start({ nodeRank: 0 });
        const node1 = c.start({ nodeRank: 1, model: broken });
        const t0 = Date.now();
        await node1!.failsWith('E_ST_HEADER_TOO_LARGE', /header/i);
        await node0!.failsWith('E_RDZV_PEER_FAILED', /node 1 \(.*\) failed before joining: E_ST_HEADER_TOO_LARGE/);
        assert.ok(Date.now() - t0 < 30_000, 'node 0 failed long before its 120 s timeout');
      });
    } finally {
      rmSync(broken, { recursive: true, force: true });
    }
  });

  for (const r of rejections) {
    test(`rejected at rendezvous, on every node, before loading: ${r.what}`, async () => {
      await withCluster(r.nnodes, { nnodes: r.nnodes, tp: 2 * r.nnodes, timeoutS: 4 }, async (c) => {
        const daemons = r.nodes(models).map((spec) => c.start(spec));
        await Promise.all(daemons.map((d) => d.failsWith(r.code, r.message)));
        for (const d of daemons) assert.not.ok(d.lines.some((l) => l.includes('"msg":"READY')) || d.logs().some((l) => l.msg === 'serving'), 'nothing loaded');
      });
    });
  }

  test('rejected at rendezvous: a node of another protocol version is named on every node', async () => {
    await withCluster(3, { nnodes: 3, tp: 6, timeoutS: 4 }, async (c) => {
      const daemons = [c.start({ nodeRank: 0 }), c.start({ nodeRank: 1 })];
      await daemons[0]!.waitForMsg(/^rendezvous coordinator listening$/);
      const foreign = c.run(2, 'rawPeer.js', ['foreign', c.fabric.addr(0), String(c.port), '2']);
      const message = new RegExp(`^node 2 \\(newer-weightd, .*\\) speaks rendezvous protocol version ${RDZV_PROTOCOL_VERSION + 1}, node 0 speaks ${RDZV_PROTOCOL_VERSION}: run the same weightd release on every node$`);
      await Promise.all(daemons.map((d) => d.failsWith('E_RDZV_VERSION_MISMATCH', message)));
      await foreign.exit;
      assert.ok(foreign.lines.some((l) => l.includes('"type":"rejected"') && l.includes('E_RDZV_VERSION_MISMATCH')), 'the newer node hears it too');
    });
  });

  test('a node that never arrives: after --rendezvous-timeout every node fails naming it', async () => {
    await withCluster(4, { nnodes: 4, tp: 8, timeoutS: 2 }, async (c) => {
      const daemons = [c.start({ nodeRank: 0 }), c.start({ nodeRank: 2 })];
      await Promise.all(daemons.map((d) => d.failsWith('E_RDZV_TIMEOUT', /node ranks 1, 3 never joined \(joined: 0, 2\)/)));
    });
  });

  test('node 0 never starts: the others fail at their timeout, saying where they looked', async () => {
    await withCluster(2, { nnodes: 2, tp: 4, timeoutS: 2 }, async (c) => {
      const d = c.start({ nodeRank: 1 });
      await d.failsWith('E_RDZV_TIMEOUT', new RegExp(`node 0 at ${c.fabric.addr(0).replaceAll('.', '\\.')}:${c.port} never answered`));
    });
  });

  test('a node killed during loading: every node fails', async () => {
    await withCluster(3, { nnodes: 3, tp: 6 }, async (c) => {
      const daemons = [c.start({ nodeRank: 0 }), c.start({ nodeRank: 1, faulty: { WEIGHTD_TEST_KILL_AT: 'loading' } }), c.start({ nodeRank: 2 })];
      assert.is((await daemons[1]!.exit).signal, 'SIGKILL');
      const message = /^node 1 \(.*\) disconnected before the group was ready \(.*\); start-up is all-or-nothing/;
      await Promise.all([daemons[0]!, daemons[2]!].map((d) => d.failsWith('E_RDZV_PEER_LOST', message)));
    });
  });

  test('a node whose rank fails during loading: every node fails, naming it and the cause', async () => {
    await withCluster(2, { nnodes: 2, tp: 4 }, async (c) => {
      const fault = JSON.stringify({ localRank: 1, phase: 'fill', kind: 'throw' });
      const daemons = [c.start({ nodeRank: 0 }), c.start({ nodeRank: 1, faulty: { WEIGHTD_TEST_FAULT: fault } })];
      await daemons[0]!.failsWith('E_RDZV_PEER_FAILED', /^node 1 \(.*\) failed: rank 3 \(local 1\) failed: .*fixture rank 1 throws at fill/);
      const own = await daemons[1]!.waitFor('its own failure', (_l, log) => log?.level === 50 && /^rank 3 \(local 1\) failed/.test(String(log.msg)));
      assert.ok(own);
      assert.is((await daemons[1]!.exit).code, 1);
    });
  });
}
