// A model swap across nodes (docs/multi-node.md, "Models across nodes"), with two real daemons
// on loopback (host backend, one device each, tp 2 over 2 nodes) and `weightd ctl load` run on
// each as an operator would: the new version becomes attachable on no node before it is
// resident on both; a node that fails its load, cannot plan it, or loads other content fails
// the swap on both, and the old version serves on everywhere with nothing leaked.
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient } from '../../src/client/index.js';
import { freePort } from '../../src/nodeOptions.js';
import { loopbackFabric } from '../helpers/netns.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { runCli, type CliResult } from '../helpers/runCli.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { assertServes, Cluster, e2eModels, type Daemon } from '../rendezvous/cluster.js';

const ctl = (d: Daemon, ...args: string[]): Promise<CliResult> => runCli(['ctl', '--weight-cache-socket-dir', d.socketDir, ...args], { timeoutMs: 60_000 });
const load = (d: Daemon, dir: string) => ctl(d, 'load', '--model', dir, '--name', 'model', '--tensor-parallel-size', '2');

/** No node attaches `dir`'s version: it was never made attachable. */
async function assertNotServed(d: Daemon, dir: string, what: string): Promise<void> {
  const client = await WeightdClient.connect(d.socketPaths()[0]!, { timeoutMs: 10_000 });
  try {
    const fp = await expectedFingerprint(dir, 2, d.spec.nodeRank);
    const a = await client.attach(fp);
    assert.is.not(a.status, 'attached', `${what}: node ${d.spec.nodeRank} must not serve it`);
  } finally {
    client.close();
  }
}

async function models(d: Daemon): Promise<Array<[string, string, string]>> {
  const list = JSON.parse((await ctl(d, 'list', '--json')).stdout) as { models: Array<{ name: string; state: string; model: string }> };
  return list.models.map((m) => [m.name, m.state, m.model]);
}

/** Until the daemon's model list has settled to `expected` (a drain ends when its last lease does). */
async function untilModels(d: Daemon, expected: Array<[string, string, string]>): Promise<void> {
  const want = JSON.stringify(expected);
  for (;;) {
    // Marked before listing: a change logged while the list is made is not missed.
    const seen = d.mark();
    const now = await models(d);
    if (JSON.stringify(now) === want) return;
    await d.waitFor(`models ${want} (last seen ${JSON.stringify(now)})`, (_l, log) => log !== undefined && log.msg !== 'control request', 15_000, seen);
  }
}

test('a swap across two nodes: attachable on neither until resident on both; a node failing, unable to plan, or loading other content aborts it on both, and the old version serves on', async () => {
  const base = await e2eModels();
  const root = mkdtempSync(join(tmpdir(), 'weightd-mn-swap-'));
  const v1 = base.model;
  const v2 = writeVariant(v1, join(root, 'v2'));
  // v3 is refused by node 1's devices (the fixture reports them full for a checkpoint under /v3/).
  const v3 = join(root, 'v3');
  cpSync(base.other, v3, { recursive: true });
  // Node 1's copy of v4 is cut short: node 1 cannot even plan it.
  const v4 = writeVariant(base.other, join(root, 'v4'));
  const v4broken = join(root, 'n1', 'v4');
  cpSync(v4, v4broken, { recursive: true });
  const shard = join(v4broken, readdirSync(v4broken).filter((n) => n.endsWith('.safetensors')).sort().at(-1)!);
  truncateSync(shard, readFileSync(shard).length - 64);
  // Node 1's v5 holds other content than node 0's under the same name and shapes.
  const v5 = join(root, 'v5');
  cpSync(base.other, v5, { recursive: true });
  const v5other = writeVariant(base.other, join(root, 'n1', 'v5'));

  const cluster = new Cluster(loopbackFabric(2), await freePort(), { nnodes: 2, tp: 2, timeoutS: 30, model: v1 });
  try {
    const n0 = cluster.start({ nodeRank: 0 });
    const n1 = cluster.start({ nodeRank: 1, faulty: { WEIGHTD_TEST_MODEL_SCENARIO: JSON.stringify({ freeBytes: 4096, onlyFiles: '/v3/' }) } });
    // Node 1 runs the fixture (no READY line of the CLI's): the group-ready line says both serve.
    await Promise.all([n0.groupReady(), n1.waitForMsg(/^group ready: every node is serving$/)]);
    await assertServes(n0, v1, 'v1');

    // v2 on node 0 alone: resident there, but nobody may attach it until node 1 has it too.
    const mark = n0.mark();
    const first = load(n0, v2);
    await n0.waitForMsg(/^model "model": waiting for node rank 1 to load it too$/, mark);
    await n0.waitForMsg(/^model "model" is resident here; waiting for node 0's commit$/, mark);
    await assertNotServed(n0, v2, 'v2 resident on node 0 only');
    await assertServes(n0, v1, 'v1 while v2 waits');
    const second = await load(n1, v2);
    const firstDone = await first;
    for (const r of [firstDone, second]) {
      assert.is(r.code, 0, r.stderr);
      assert.match(r.stdout, /^model loaded and serving \(fingerprint [0-9a-f]{64}\)\n$/);
    }
    for (const d of [n0, n1]) await assertServes(d, v2, 'v2 after the swap');
    // The node's own model stays listed, released, once the last lease on it ended.
    const settled: Array<[string, string, string]> = [['model', 'released', v1], ['model', 'serving', v2]];
    for (const d of [n0, n1]) await untilModels(d, settled);
    const held = [n0, n1].map((d) => weightdMemfds(d.pid).length);
    assert.ok(held.every((n) => n > 0), 'each node holds its rank of v2');

    // v3: node 0 is resident first, then node 1's devices refuse it: neither serves it.
    const m3 = n0.mark();
    const third = load(n0, v3);
    await n0.waitForMsg(/^model "model" is resident here; waiting for node 0's commit$/, m3);
    const refused = await load(n1, v3);
    assert.is(refused.code, 1);
    assert.match(refused.stderr, /E_DOES_NOT_FIT: model "model" does not fit beside what is resident/);
    const aborted = await third;
    assert.is(aborted.code, 1);
    assert.match(aborted.stderr, /weightd ctl load: E_MODEL_GROUP_PEER_FAILED: model "model" failed on node 1: E_DOES_NOT_FIT: /);

    // v4: node 1 cannot plan it, before node 0 even starts: node 0 hears that at once.
    const unplanned = await load(n1, v4broken);
    assert.is(unplanned.code, 1);
    const late = await load(n0, v4);
    assert.is(late.code, 1);
    assert.match(late.stderr, /E_MODEL_GROUP_PEER_FAILED: model "model" failed on node 1: E_\w+: /);

    // v5: both plan, with different content: refused on both, naming the field.
    const [m0, m1] = await Promise.all([load(n0, v5), load(n1, v5other)]);
    for (const r of [m0, m1]) {
      assert.is(r.code, 1);
      assert.match(r.stderr, /E_MODEL_GROUP_MISMATCH: model "model": node \d's checkpoint has fingerprint [0-9a-f]{12}…, node \d's [0-9a-f]{12}… \(fields that differ: [^)]*content/);
    }

    // The old version serves on everywhere, and every failed version was freed.
    for (const [i, d] of [n0, n1].entries()) {
      await assertServes(d, v2, 'v2 after three failed swaps');
      await untilModels(d, settled);
      assert.is(weightdMemfds(d.pid).length, held[i], `node ${i} holds v2 alone again`);
    }
  } finally {
    await cluster.close();
    base.remove();
    rmSync(root, { recursive: true, force: true });
  }
});

test.run();
