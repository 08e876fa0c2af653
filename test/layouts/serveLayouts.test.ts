// get_state serves the layout asked for: the vllm views by vLLM's names over the same segment
// as the checkpoint views, padding rows zero in the host segment (a fresh fallocated file: no op
// writes them); a layout the daemon did not plan is refused naming those it has, and one it
// could not plan for this checkpoint with the planner's reason.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient } from '../../src/client/index.js';
import type { HostTensor } from '../../src/client/segmentAccess.js';
import { ServeError } from '../../src/errors.js';
import { oneRankServer } from '../serve/oneRankServer.js';
import { makeTempDir, rejectsWith, removeDir, writeArchCheckpoint } from '../helpers/checkpoints.js';
import { freshSocketDir } from '../helpers/paths.js';
import { loadServedRank } from '../serve/servedRankFixture.js';

const log = pino({ level: 'silent' });

async function serve(layouts: Array<'vllm'>, vocab: number, run: (client: WeightdClient, expected: { fingerprint: string }) => Promise<void>, arch = 'LlamaForCausalLM'): Promise<void> {
  const dir = makeTempDir('serve-layouts');
  const sockets = freshSocketDir();
  await writeArchCheckpoint(dir, arch, { hidden: 16, heads: 4, kvHeads: 2, headDim: 4, intermediate: 32, layers: 1, vocab, shards: 1 });
  const loaded = await loadServedRank(dir, { uuid: `layouts-${process.pid}` }, layouts);
  const server = oneRankServer({ rank: loaded.served, socketDir: sockets, log, freeMemory: () => loaded.device.free() });
  let client: WeightdClient | undefined;
  try {
    client = await WeightdClient.connect(await server.listen());
    await run(client, await expectedFingerprint(dir, 1, 0));
  } finally {
    client?.close();
    server.close();
    await loaded.device.free();
    removeDir(dir);
    removeDir(sockets);
  }
}

test('attach with layout vllm: engine names over the checkpoint bytes, zero padding rows', () =>
  serve(['vllm'], 1000, async (client, expected) => {
    assert.equal((await client.ping()).layouts, ['checkpoint', 'vllm']);
    const vllm = await client.attach(expected, { layout: 'vllm' });
    const ckpt = await client.attach(expected);
    assert.ok(vllm.status === 'attached' && ckpt.status === 'attached');
    try {
      assert.is(vllm.state.layout, 'vllm');
      assert.is(ckpt.state.layout, 'checkpoint');
      assert.ok(vllm.backend === 'host' && ckpt.backend === 'host');
      const bytesOf = (t: HostTensor): Uint8Array => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
      const v = Object.fromEntries(Object.entries(vllm.tensors).map(([n, t]) => [n, { shape: t.shape, bytes: bytesOf(t) }]));
      const c = Object.fromEntries(Object.entries(ckpt.tensors).map(([n, t]) => [n, { shape: t.shape, bytes: bytesOf(t) }]));
      assert.ok('model.layers.0.self_attn.qkv_proj.weight' in v && !('model.layers.0.self_attn.q_proj.weight' in v));
      assert.ok(!('lm_head.weight' in c) || 'lm_head.weight' in v, 'untied lm_head is in both');
      const embed = v['model.embed_tokens.weight']!;
      // 1000 rows padded to 1024: the first 1000 rows are the checkpoint's, 24 rows are zero.
      assert.equal(embed.shape, [1024, 16]);
      assert.equal(c['model.embed_tokens.weight']!.shape, [1000, 16]);
      const real = 1000 * 16 * 2;
      assert.ok(Buffer.from(embed.bytes.subarray(0, real)).equals(Buffer.from(c['model.embed_tokens.weight']!.bytes)));
      assert.ok(embed.bytes.subarray(real).every((b) => b === 0), 'padding rows read as zero');
      const qkv = v['model.layers.0.self_attn.qkv_proj.weight']!;
      const parts = ['q', 'k', 'v'].map((x) => Buffer.from(c[`model.layers.0.self_attn.${x}_proj.weight`]!.bytes));
      assert.ok(Buffer.from(qkv.bytes).equals(Buffer.concat(parts)));
    } finally {
      if (vllm.status === 'attached') await vllm.detach();
      if (ckpt.status === 'attached') await ckpt.detach();
    }
  }));

test('a layout the daemon did not plan is refused, naming the layouts it has', () =>
  serve([], 1000, async (client, expected) => {
    assert.equal((await client.ping()).layouts, ['checkpoint']);
    await rejectsWith(() => client.attach(expected, { layout: 'vllm' }), ServeError, 'E_UNKNOWN_LAYOUT', '"vllm"', 'checkpoint', '--layouts checkpoint,vllm');
    await rejectsWith(() => client.copy(expected, { layout: 'sglang' }), ServeError, 'E_UNKNOWN_LAYOUT', '"sglang"', 'has the layouts checkpoint, vllm');
    assert.is((await client.stats()).leases.length, 0, 'a refusal holds no lease');
  }));

test('a layout asked for that this checkpoint cannot have is refused with the reason of the planner; the checkpoint layout is served', () =>
  serve(['vllm'], 1000, async (client, expected) => {
    assert.equal((await client.ping()).layouts, ['checkpoint']);
    await rejectsWith(() => client.attach(expected, { layout: 'vllm' }), ServeError, 'E_UNKNOWN_LAYOUT', '"vllm"', 'cannot be served under it', 'does not know architecture "Qwen2MoeForCausalLM"', 'Load from disk');
    const ckpt = await client.attach(expected);
    assert.ok(ckpt.status === 'attached');
    await ckpt.detach();
  }, 'Qwen2MoeForCausalLM'));

test.run();
