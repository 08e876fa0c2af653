// A checkpoint of tens of thousands of tensors (a large MoE model's count: DeepSeek-V3 has about
// 90,000) is kept and adopted like a small one: its rank's record (a 32-hex digest per tensor,
// the packed plan) is megabytes, past the 1 MiB a KEEP request held before (issue 33). Here
// ~50,000 tiny tensors (a few MB in all): the first start keeps the shard with its plan, the
// restart adopts it, plans from the record, and serves every tensor's bytes as the files hold them.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket } from '../../src/client/index.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { killKeeper, waitUntil } from '../helpers/keeper.js';
import { freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { runClient } from '../client/runClient.js';

/** Llama layers of 9 tensors each, plus the embedding, the final norm and the head: 50,403 tensors. */
const LAYERS = 5600;
const TENSORS = LAYERS * 9 + 3;
const PLANNED_FROM_KEEPER = /"from":"keeper","headersRead":0,[^\n]*"msg":"checkpoint planned"/;

test(`a checkpoint of ${TENSORS} tensors is kept with its plan, and the restart adopts it, plans from its record and serves the files' bytes`, async () => {
  const model = join(freshTempDir(), 'many');
  mkdirSync(model);
  await writeArchCheckpoint(model, 'LlamaForCausalLM', { hidden: 8, heads: 2, kvHeads: 1, headDim: 4, intermediate: 8, vocab: 16, layers: LAYERS, shards: 4 });
  const socketDir = join(freshSocketDir(), 's');
  const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
  const opts = {
    model,
    tp: 1,
    socketDir,
    devices: [`many${process.pid}-${Math.random().toString(36).slice(2, 8)}-0`],
    extraArgs: ['--keeper', 'spawn', '--adopt-within', '60', '--log-level', 'debug'],
    readyTimeoutMs: 120_000,
  };
  try {
    const first = await startDaemon(opts);
    // The keep runs after READY: it succeeded once the keeper holds the record, or it said why not.
    await waitUntil(
      () => `the keeper holds the shard (daemon said: ${/"msg":"the keeper did not take[^\n]*/.exec(first.stderr())?.[0] ?? 'nothing about it'})`,
      async () => (await keeper.list().catch(() => [])).length === 1 || /the keeper did not take this rank's shard/.test(first.stderr()),
      60_000,
    );
    const refused = /"msg":"the keeper did not take this rank's shard[^\n]*/.exec(first.stderr());
    assert.is(refused, null, `the keep succeeds, and the daemon said: ${refused?.[0]}`);
    const [record] = await keeper.list();
    assert.ok(record!.record.length > 1 << 20, `the record (${record!.record.length} bytes) is past the old 1 MiB frame`);
    assert.match(record!.record.toString('utf8'), /"plan":\{/, 'the record carries the plan');
    assert.is((await first.stop()).code, 0);

    const second = await startDaemon(opts);
    try {
      assert.match(second.stderr(), /"adoptedRanks":1[,}]/);
      assert.match(second.stderr(), PLANNED_FROM_KEEPER, 'planned from the kept record');
      const socket = await findSocket({ socketDir, globalRank: 0 });
      const { tensors: hashes } = await runClient<{ tensors: Record<string, { sha256: string }> }>('ts', 'hashes', socket, await expectedFingerprint(model, 1, 0), 'map');
      const expected = expectedRank(model, 1, 0);
      assert.is(Object.keys(hashes).length, TENSORS);
      assert.is(expected.size, TENSORS);
      for (const [name, e] of expected) assert.is(hashes[name]?.sha256, e.sha256, name);
    } finally {
      await second.stop();
    }
  } finally {
    await killKeeper(keeper);
  }
});

test.run();
