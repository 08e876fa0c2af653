// Nodes compare what they hold at the ready barrier: two host nodes of one tp=4 group, each
// loading only its own two ranks' slices, whose copies differ in one byte that the sampled
// fingerprint does not see (so both join). Every node digests every tensor whole, so the
// difference is found whichever node's ranks would copy that byte: the group fails on both nodes,
// naming node 1 and the tensor. Equal copies form the group (the e2e scenarios).
import { cpSync, closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { freePort } from '../../src/nodeOptions.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { loopbackFabric } from '../helpers/netns.js';
import { Cluster } from './cluster.js';

test('a node whose copy differs by one byte outside the sample is refused at the ready barrier, naming the node and the tensor', async () => {
  const root = mkdtempSync(join(tmpdir(), 'weightd-rdzv-digest-'));
  const fabric = loopbackFabric(2);
  let cluster: Cluster | undefined;
  try {
    const model = join(root, 'node0');
    mkdirSync(model);
    // 24 MiB of data: more than the 16 MiB a sample covers whole, so the sample skips bytes.
    await writeArchCheckpoint(model, 'LlamaForCausalLM', { hidden: 512, heads: 8, kvHeads: 4, intermediate: 1536, vocab: 4096, layers: 3 });
    const copy = join(root, 'node1');
    cpSync(model, copy, { recursive: true });
    // A row-parallel tensor: at tp=4 split over 2 nodes, node 1's ranks copy only the right half of
    // each 1 KiB row, and this byte (row 4, column 114: rank 0's quarter) is one only node 0's
    // ranks copy. 128 + 4096 + 100 bytes in: past the sample's head and first interior block.
    const victim = 'model.layers.1.self_attn.o_proj.weight';
    const index = JSON.parse(readFileSync(join(copy, 'model.safetensors.index.json'), 'utf8')) as { weight_map: Record<string, string> };
    const file = join(copy, index.weight_map[victim]!);
    const t = (await parseSafetensors(file)).tensors.find((x) => x.name === victim)!;
    const fd = openSync(file, 'r+');
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, t.begin + 128 + 4096 + 100);
    b[0] = b[0]! ^ 0x01;
    writeSync(fd, b, 0, 1, t.begin + 128 + 4096 + 100);
    closeSync(fd);
    const [p0, p1] = [await planCheckpoint(model, { tpSize: 4 }), await planCheckpoint(copy, { tpSize: 4 })];
    assert.is(p1.fingerprint, p0.fingerprint, 'the sampled fingerprint cannot tell the copies apart');

    cluster = new Cluster(fabric, await freePort(), { nnodes: 2, tp: 4, timeoutS: 60, model });
    const nodes = [cluster.start({ nodeRank: 0 }), cluster.start({ nodeRank: 1, model: copy })];
    for (const node of nodes) {
      const line = await node.failsWith('E_RDZV_CONTENT_DIFFERS', new RegExp(`node 1 .*holds other bytes than node 0 in 1 tensor\\(s\\): ${victim.replaceAll('.', '\\.')}`), 60_000);
      assert.ok(line.msg);
    }
  } finally {
    await cluster?.close();
    fabric.close();
    rmSync(root, { recursive: true, force: true });
  }
});

test.run();
