// A model that spans the group goes stale (docs/multi-node.md, "A checkpoint changed under a model
// across nodes"), with two real daemons on loopback (host backend, one device each, tp 2 over 2
// nodes), each reading its own copy of the checkpoint. Each copy is changed by renaming a new
// shard over its only one, so that every plan sees the old or the new file whole, or touched.
// Fails before the reload across nodes: a node logged that it does not load such a model again.
import { copyFileSync, cpSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, statSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient, type Attached } from '../../src/client/index.js';
import { freePort } from '../../src/nodeOptions.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { loopbackFabric } from '../helpers/netns.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { assertServes, Cluster, type Daemon } from '../rendezvous/cluster.js';

/**
 * Node `d` does not attach the version in `dir`: it never served it, or refuses it (a stale
 * version is refused E_STALE while it drains, E_RELEASED once its rank was freed).
 */
async function assertNotServed(d: Daemon, dir: string, what: string): Promise<void> {
  const client = await WeightdClient.connect(d.socketPaths()[0]!, { timeoutMs: 10_000 });
  try {
    const outcome = await client.attach(await expectedFingerprint(dir, 2, d.spec.nodeRank)).then((a) => a.status, (err: { code?: string }) => err.code ?? String(err));
    assert.ok(['mismatch', 'E_STALE', 'E_RELEASED'].includes(outcome), `${what}: node ${d.spec.nodeRank} must not serve it, got ${outcome}`);
  } finally {
    client.close();
  }
}

/** Until node `d` serves the version in `dir`: each time a model loads there (or fails to), it looks again. */
async function untilServes(d: Daemon, dir: string): Promise<void> {
  const fingerprint = await expectedFingerprint(dir, 2, d.spec.nodeRank);
  for (;;) {
    const seen = d.mark();
    const client = await WeightdClient.connect(d.socketPaths()[0]!, { timeoutMs: 10_000 });
    try {
      const a = await client.attach(fingerprint).catch(() => undefined);
      if (a?.status === 'attached') {
        await (a as Attached).detach();
        return;
      }
    } finally {
      client.close();
    }
    await d.waitForMsg(/^model "model"( was loaded again|: its checkpoint files still hold| was not loaded again)/, seen, 30_000);
  }
}

/** Puts `from`'s shard in place of `dir`'s by a rename: a new inode, whole at once. */
function replaceShard(from: string, dir: string): void {
  const shard = readdirSync(dir).find((n) => n.endsWith('.safetensors'))!;
  copyFileSync(join(from, shard), join(dir, `${shard}.new`));
  renameSync(join(dir, `${shard}.new`), join(dir, shard));
}

const MISMATCH = /model "model": node \d's checkpoint has fingerprint [0-9a-f]{12}…, node \d's [0-9a-f]{12}… \(fields that differ: [^)]*content/;

test('a model across two nodes whose files change: refused on both while only one node\'s copy changed, naming the nodes; loaded again on both once both copies hold the same new content; a touched copy is loaded again beside the unchanged one; copies changed at once end served on both', async () => {
  const root = mkdtempSync(join(tmpdir(), 'weightd-mn-stale-'));
  const v1 = join(root, 'v1');
  mkdirSync(v1);
  await writeArchCheckpoint(v1, 'LlamaForCausalLM', { hidden: 96, heads: 24, kvHeads: 24, headDim: 4, intermediate: 192, vocab: 384, layers: 2, shards: 1 });
  const v2 = writeVariant(v1, join(root, 'v2'));
  const v3 = writeVariant(v1, join(root, 'v3'), 0x0f);
  // Each node's own copy, under the same name ("model").
  const [dir0, dir1] = [0, 1].map((n) => {
    const dir = join(root, `n${n}`, 'model');
    cpSync(v1, dir, { recursive: true });
    return dir;
  });
  const cluster = new Cluster(loopbackFabric(2), await freePort(), { nnodes: 2, tp: 2, timeoutS: 30, model: dir0! });
  try {
    const n0 = cluster.start({ nodeRank: 0 });
    const n1 = cluster.start({ nodeRank: 1, model: dir1 });
    await Promise.all([n0.groupReady(), n1.groupReady()]);

    // Only node 1's copy changes: it finds its version stale, node 0 has both load the model
    // again, and node 0's files still hold v1: the two nodes' fingerprints differ.
    const [a0, a1] = [n0.mark(), n1.mark()];
    replaceShard(v2, dir1!);
    await n0.waitForMsg(/^model "model" went stale on node 1: every node loads it again from its files$/, a0, 30_000);
    const refused1 = await n1.waitForMsg(/^model "model" was not loaded again after its checkpoint files changed \(/, a1, 30_000);
    assert.is(refused1.code, 'E_MODEL_GROUP_MISMATCH');
    assert.match(refused1.msg!, MISMATCH);
    const refused0 = await n0.waitForMsg(/^model "model" was not loaded again across the group: /, a0, 30_000);
    assert.is(refused0.code, 'E_MODEL_GROUP_MISMATCH');
    assert.match(refused0.msg!, MISMATCH);
    // Node 0's copy did not change: it serves on. Node 1 serves neither its stale v1 nor its v2.
    await assertServes(n0, dir0!, "node 0's unchanged v1");
    await assertNotServed(n1, v1, "node 1's stale v1");
    await assertNotServed(n1, dir1!, "node 1's v2, which node 0 does not hold");

    // Node 0's copy changes the same way: both copies hold v2, and the group loads it on both.
    const [b0, b1] = [n0.mark(), n1.mark()];
    replaceShard(v2, dir0!);
    for (const [d, since] of [[n0, b0], [n1, b1]] as const) {
      await d.waitForMsg(/^model "model" was loaded again from its changed checkpoint files, and serves$/, since, 30_000);
    }
    for (const [d, dir] of [[n0, dir0!], [n1, dir1!]] as const) await assertServes(d, dir, 'v2 after the reload across nodes');

    // Node 1's shard is touched (its ctime moves, its bytes do not): node 1 loads v2 again, node 0
    // joins that swap with the v2 it serves, and both serve v2.
    const [c0, c1] = [n0.mark(), n1.mark()];
    const shard = join(dir1!, readdirSync(dir1!).find((n) => n.endsWith('.safetensors'))!);
    const { atime, mtime } = statSync(shard);
    utimesSync(shard, atime, mtime);
    await n1.waitForMsg(/^model "model" was loaded again from its changed checkpoint files, and serves$/, c1, 30_000);
    await n0.waitForMsg(/^model "model": its checkpoint files still hold the version that serves$/, c0, 30_000);
    for (const [d, dir] of [[n0, dir0!], [n1, dir1!]] as const) await assertServes(d, dir, 'v2 after node 1 touched its copy');

    // Both copies change to v3 at once, as an operator's copy to every node does: each node finds
    // its copy stale and tells node 0, so every node hears two reports, in any order with its own
    // check. Whatever each report's swap meets, the group ends serving v3 on both nodes.
    replaceShard(v3, dir1!);
    replaceShard(v3, dir0!);
    for (const d of [n0, n1]) await untilServes(d, d === n0 ? dir0! : dir1!);
    for (const [d, dir] of [[n0, dir0!], [n1, dir1!]] as const) await assertServes(d, dir, 'v3 after both copies changed');
  } finally {
    await cluster.close();
    rmSync(root, { recursive: true, force: true });
  }
});

test.run();
