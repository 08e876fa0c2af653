// `weightd ctl load` on every node of a version that some nodes serve already (docs/multi-node.md,
// "Models across nodes"), with two real daemons on loopback (host backend, one device each, tp 2
// over 2 nodes): a node that serves it joins the swap with that version, resident at once, so the
// node that loads it is not left waiting for it (before, it answered "already loaded" and the other
// node's load ran out its group timeout, E_MODEL_GROUP_TIMEOUT), and each node's ctl load says so.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freePort } from '../../src/nodeOptions.js';
import { loopbackFabric } from '../helpers/netns.js';
import { runCli, type CliResult } from '../helpers/runCli.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { assertServes, Cluster, e2eModels, type Daemon } from '../rendezvous/cluster.js';

const ctl = (d: Daemon, ...args: string[]): Promise<CliResult> => runCli(['ctl', '--weight-cache-socket-dir', d.socketDir, ...args], { timeoutMs: 120_000 });
const load = (d: Daemon, dir: string) => ctl(d, 'load', '--model', dir, '--name', 'model', '--tensor-parallel-size', '2');

test('a ctl load on both nodes of a version node 0 serves and node 1 unloaded: node 0 joins the swap as resident, node 1 loads it, both serve it; other content on node 1 is refused on both', async () => {
  const base = await e2eModels();
  const root = mkdtempSync(join(tmpdir(), 'weightd-mn-served-'));
  const v1 = base.model;
  const other = writeVariant(v1, join(root, 'other'));
  const cluster = new Cluster(loopbackFabric(2), await freePort(), { nnodes: 2, tp: 2, timeoutS: 30, model: v1 });
  try {
    const n0 = cluster.start({ nodeRank: 0 });
    const n1 = cluster.start({ nodeRank: 1 });
    await Promise.all([n0.groupReady(), n1.groupReady()]);

    // Node 1 lets go of the model (as after a refused reload across the group); node 0 serves on.
    const unloaded = await ctl(n1, 'unload', 'model');
    assert.is(unloaded.code, 0, unloaded.stderr);

    const [served, loaded] = await Promise.all([load(n0, v1), load(n1, v1)]);
    assert.is(served.code, 0, served.stderr);
    assert.match(served.stdout, /^model is already loaded \(fingerprint [0-9a-f]{64}\): nothing to do\n$/);
    assert.is(loaded.code, 0, loaded.stderr);
    assert.match(loaded.stdout, /^model loaded and serving \(fingerprint [0-9a-f]{64}\)\n$/);
    for (const d of [n0, n1]) await assertServes(d, v1, 'v1 on both nodes again');

    // A node that serves the version still stands by the group's verdict: other content under the
    // name on node 1 refuses the swap on both, and node 0's load says so too.
    const [kept, refused] = await Promise.all([load(n0, v1), load(n1, other)]);
    for (const r of [kept, refused]) {
      assert.is(r.code, 1, r.stdout);
      assert.match(r.stderr, /E_MODEL_GROUP_MISMATCH: model "model": node \d's checkpoint has fingerprint [0-9a-f]{12}…, node \d's [0-9a-f]{12}… \(fields that differ: [^)]*content/);
    }
    for (const d of [n0, n1]) await assertServes(d, v1, 'v1 on both nodes after the refused swap');
  } finally {
    await cluster.close();
    base.remove();
    rmSync(root, { recursive: true, force: true });
  }
});

test.run();
