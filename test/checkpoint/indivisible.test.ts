// A dimension that does not divide by the tp size is a ShardingError at plan time, naming the
// tensor, the dim, its size and the tp size.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { ShardingError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir, writeArchCheckpoint } from '../helpers/checkpoints.js';

async function expectIndivisible(options: Parameters<typeof writeArchCheckpoint>[2], tp: number, tensor: string, dim: number, size: number): Promise<void> {
  const dir = makeTempDir('indiv');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1, ...options });
    const err = await rejectsWith(() => planCheckpoint(dir, { tpSize: tp }), ShardingError, 'E_SHARD_INDIVISIBLE', `"${tensor}"`, `dim ${dim}`, `size ${size}`, `tp size ${tp}`);
    if (err.details.tensor !== tensor || err.details.dim !== dim || err.details.size !== size || err.details.tpSize !== tp) throw new Error(`details: ${JSON.stringify(err.details)}`);
  } finally {
    removeDir(dir);
  }
}

// A vocab is padded to a multiple of 64 before it is divided (vLLM's VocabParallelEmbedding),
// so only a padded count the tp size does not divide is refused: 250 -> 256 over tp 3.
test('vocab-parallel embedding: vocab 250 (padded 256) over tp 3', () => expectIndivisible({ vocab: 250, heads: 6, kvHeads: 3, hidden: 48, intermediate: 96 }, 3, 'model.embed_tokens.weight', 0, 256));
test('column-parallel MLP: intermediate 100 over tp 8', () => expectIndivisible({ intermediate: 100 }, 8, 'model.layers.0.mlp.gate_proj.weight', 0, 100));
test('row-parallel split is checked on dim 1', async () => {
  const dir = makeTempDir('indiv-row');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1, intermediate: 100 });
    // gate/up (dim 0 = 100) would fail first; replicating them leaves down_proj's dim 1.
    const planFile = join(dir, 'plan.json');
    writeFileSync(planFile, JSON.stringify({ rules: [{ pattern: '\\.(gate|up)_proj\\.weight$', rule: 'replicated' }] }));
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 8, planFile }), ShardingError, 'E_SHARD_INDIVISIBLE', '"model.layers.0.mlp.down_proj.weight"', 'dim 1', 'size 100', 'tp size 8');
  } finally {
    removeDir(dir);
  }
});

test('a tp size that is not a positive integer: E_SHARD_TP_SIZE', async () => {
  const dir = makeTempDir('indiv-tp');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1 });
    for (const tp of [0, -2, 1.5, Number.NaN]) await rejectsWith(() => planCheckpoint(dir, { tpSize: tp }), ShardingError, 'E_SHARD_TP_SIZE', String(tp));
  } finally {
    removeDir(dir);
  }
});

test.run();
