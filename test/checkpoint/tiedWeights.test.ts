// Tied weights: lm_head shares the input embedding. It is loaded once and recorded as an alias,
// whether the checkpoint stores lm_head or not.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { CheckpointError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeCheckpoint } from '../helpers/checkpoints.js';

const ALIAS = { 'lm_head.weight': 'model.embed_tokens.weight' };

async function withCheckpoint(arch: string, config: Record<string, unknown>, dropLmHead: boolean, run: (dir: string) => Promise<void>): Promise<void> {
  const dir = makeTempDir('tied');
  try {
    const tensors = await writeArchCheckpoint(dir, arch, { layers: 1, shards: 1, config });
    if (dropLmHead) {
      const written = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
      await writeCheckpoint(dir, written, tensors.filter((t) => t.name !== 'lm_head.weight'), 1);
    }
    await run(dir);
  } finally {
    removeDir(dir);
  }
}

test('tie_word_embeddings true and lm_head absent (Gemma): lm_head is an alias of the embedding', () =>
  withCheckpoint('GemmaForCausalLM', {}, false, async (dir) => {
    const plan = await planCheckpoint(dir, { tpSize: 2 });
    for (const rank of plan.ranks) {
      assert.equal(rank.aliases, ALIAS);
      assert.not.ok(rank.tensors.some((t) => t.name === 'lm_head.weight'));
      assert.ok(rank.tensors.some((t) => t.name === 'model.embed_tokens.weight'));
    }
  }));

test('tie_word_embeddings true with lm_head stored (Llama): lm_head is not loaded a second time', () =>
  withCheckpoint('LlamaForCausalLM', { tie_word_embeddings: true }, false, async (dir) => {
    const tied = await planCheckpoint(dir, { tpSize: 2 });
    assert.equal(tied.ranks[0]!.aliases, ALIAS);
    assert.not.ok(tied.ranks[0]!.tensors.some((t) => t.name === 'lm_head.weight'));
    // Loaded once: the rank copies exactly one lm_head-sized piece fewer than an untied plan.
    writeFileSync(join(dir, 'config.json'), readFileSync(join(dir, 'config.json'), 'utf8').replace('"tie_word_embeddings": true', '"tie_word_embeddings": false'));
    const untied = await planCheckpoint(dir, { tpSize: 2 });
    const lmHead = untied.ranks[0]!.tensors.find((t) => t.name === 'lm_head.weight')!;
    assert.is(tied.ranks[0]!.totalBytes, untied.ranks[0]!.totalBytes - lmHead.bytes);
  }));

test('tie_word_embeddings false: lm_head is its own tensor', () =>
  withCheckpoint('LlamaForCausalLM', { tie_word_embeddings: false }, false, async (dir) => {
    const plan = await planCheckpoint(dir, { tpSize: 2 });
    assert.equal(plan.ranks[0]!.aliases, {});
    assert.ok(plan.ranks[0]!.tensors.some((t) => t.name === 'lm_head.weight'));
  }));

test('tie_word_embeddings false and lm_head absent: E_CKPT_MISSING_TENSOR', () =>
  withCheckpoint('LlamaForCausalLM', { tie_word_embeddings: false }, true, async (dir) => {
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 2 }), CheckpointError, 'E_CKPT_MISSING_TENSOR', 'lm_head.weight', 'tie_word_embeddings');
  }));

test('a Gemma config that leaves tie_word_embeddings out follows the HF default (tied)', () =>
  withCheckpoint('Gemma2ForCausalLM', { tie_word_embeddings: undefined }, false, async (dir) => {
    const plan = await planCheckpoint(dir, { tpSize: 1 });
    assert.equal(plan.ranks[0]!.aliases, ALIAS);
  }));

test.run();
