// Tensors no rule places: an error that lists the first 20 and counts the rest, rather than a
// silent guess.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { ShardingError } from '../../src/errors.js';
import { fixtureTensor, makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeCheckpoint } from '../helpers/checkpoints.js';

const names = Array.from({ length: 25 }, (_, i) => `blocks.${String(i).padStart(2, '0')}.mix.weight`);

test('an unknown architecture without a plan file lists 20 tensors and the count of the rest', async () => {
  const dir = makeTempDir('unknown');
  try {
    await writeCheckpoint(dir, { architectures: ['StrangeLMForCausalLM'] }, names.map((n) => fixtureTensor(n, [4, 4], 'full')), 1);
    const err = await rejectsWith(() => planCheckpoint(dir, { tpSize: 2 }), ShardingError, 'E_SHARD_UNPLACED', 'StrangeLMForCausalLM', '25 tensor(s)', names[0]!, names[19]!, '... and 5 more', 'plan file');
    assert.not.ok(err.message.includes(names[20]!), 'only the first 20 are listed');
    assert.is(err.details.count, 25);
  } finally {
    removeDir(dir);
  }
});

test('a plan file that covers only some tensors: the rest are listed', async () => {
  const dir = makeTempDir('unknown-partial');
  try {
    await writeCheckpoint(dir, { architectures: ['StrangeLMForCausalLM'] }, names.map((n) => fixtureTensor(n, [4, 4], 'full')), 1);
    const planFile = join(dir, 'plan.json');
    writeFileSync(planFile, JSON.stringify({ rules: [{ pattern: '^blocks\\.(0\\d|1\\d)\\.', rule: 'replicated' }] }));
    const err = await rejectsWith(() => planCheckpoint(dir, { tpSize: 2, planFile }), ShardingError, 'E_SHARD_UNPLACED', 'plan file matches none of 5 tensor(s)', 'blocks.20.mix.weight', 'blocks.24.mix.weight');
    assert.not.ok(err.message.includes('blocks.19.'));
  } finally {
    removeDir(dir);
  }
});

test('in a known architecture an unnamed matrix is an error, an unnamed vector is replicated', async () => {
  const dir = makeTempDir('unknown-tensor');
  try {
    const tensors = await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1, shards: 1 });
    tensors.push(fixtureTensor('model.layers.0.self_attn.rotary_emb.inv_freq', [4], 'full', 'F32'));
    await writeCheckpoint(dir, JSON.parse('{"architectures":["LlamaForCausalLM"],"num_attention_heads":8,"num_key_value_heads":4,"head_dim":8}'), tensors, 1);
    const plan = await planCheckpoint(dir, { tpSize: 2 });
    assert.equal(plan.ranks[1]!.tensors.find((t) => t.name.endsWith('inv_freq'))!.rule, { kind: 'replicated' });

    tensors.push(fixtureTensor('model.layers.0.self_attn.mystery_proj.weight', [8, 64], 'full'));
    await writeCheckpoint(dir, JSON.parse('{"architectures":["LlamaForCausalLM"],"num_attention_heads":8,"num_key_value_heads":4,"head_dim":8}'), tensors, 1);
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 2 }), ShardingError, 'E_SHARD_UNPLACED', 'no llama sharding rule matches 1 tensor(s)', 'mystery_proj.weight [8,64]');
  } finally {
    removeDir(dir);
  }
});

test.run();
