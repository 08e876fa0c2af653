// The model directory and its index: which files are the checkpoint, and every way the index,
// the shards and config.json can disagree.
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { writeSafetensors } from '../../src/checkpoint/writeSafetensors.js';
import { CheckpointError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeRawSafetensors } from '../helpers/checkpoints.js';

const SHARD1 = 'model-00001-of-00002.safetensors';
const SHARD2 = 'model-00002-of-00002.safetensors';
const INDEX = 'model.safetensors.index.json';

/** A valid two-shard Llama checkpoint, changed by `mutate`, must fail planning with `code`. */
function badCheckpoint(name: string, code: string, mutate: (dir: string) => void | Promise<void>, ...mentions: string[]): void {
  test(`${name}: ${code}`, async () => {
    const dir = makeTempDir('index');
    try {
      await writeArchCheckpoint(dir, 'LlamaForCausalLM');
      await mutate(dir);
      await rejectsWith(() => planCheckpoint(dir, { tpSize: 2 }), CheckpointError, code, ...mentions);
    } finally {
      removeDir(dir);
    }
  });
}

const readIndex = (dir: string): { weight_map: Record<string, string> } => JSON.parse(readFileSync(join(dir, INDEX), 'utf8'));
const writeIndex = (dir: string, index: unknown): void => writeFileSync(join(dir, INDEX), typeof index === 'string' ? index : JSON.stringify(index));
const editWeightMap = (dir: string, edit: (map: Record<string, string>) => void): void => {
  const index = readIndex(dir);
  edit(index.weight_map);
  writeIndex(dir, index);
};

badCheckpoint('a shard listed by the index is missing', 'E_CKPT_INDEX_MISSING_FILE', (d) => rmSync(join(d, SHARD2)), SHARD2);
badCheckpoint('a shard holds a tensor the index does not list', 'E_CKPT_INDEX_UNLISTED_TENSOR', (d) => editWeightMap(d, (m) => { delete m['model.norm.weight']; }), 'model.norm.weight', SHARD2);
badCheckpoint('the index puts a tensor in the wrong shard', 'E_CKPT_INDEX_WRONG_FILE', (d) => editWeightMap(d, (m) => { m['model.norm.weight'] = SHARD1; }), 'model.norm.weight', SHARD1, SHARD2);
badCheckpoint('the index lists a tensor no shard holds', 'E_CKPT_INDEX_MISSING_TENSOR', (d) => editWeightMap(d, (m) => { m['model.layers.9.mlp.up_proj.weight'] = SHARD2; }), 'model.layers.9.mlp.up_proj.weight');
badCheckpoint('a tensor is stored in two shards', 'E_CKPT_DUPLICATE_TENSOR', async (d) => {
  // Shard 2 rewritten with one more tensor that shard 1 already holds.
  await writeSafetensors(join(d, SHARD2), [{ name: 'model.embed_tokens.weight', dtype: 'BF16', shape: [256, 64] }, { name: 'model.norm.weight', dtype: 'BF16', shape: [64] }, { name: 'lm_head.weight', dtype: 'BF16', shape: [256, 64] }]);
}, 'model.embed_tokens.weight', SHARD1, SHARD2);
badCheckpoint('a .safetensors file the index does not name', 'E_CKPT_UNLISTED_FILE', (d) => writeRawSafetensors(join(d, 'stale.safetensors'), '{}'), 'stale.safetensors');
badCheckpoint('the index is not JSON', 'E_CKPT_INDEX_JSON', (d) => writeIndex(d, '{"weight_map": '), INDEX);
badCheckpoint('the index has no weight_map', 'E_CKPT_INDEX_SCHEMA', (d) => writeIndex(d, { metadata: {} }), 'weight_map');
badCheckpoint('a weight_map value is not a string', 'E_CKPT_INDEX_SCHEMA', (d) => editWeightMap(d, (m) => { (m as Record<string, unknown>)['model.norm.weight'] = 2; }), 'model.norm.weight');
badCheckpoint('the index points outside the model directory', 'E_CKPT_INDEX_BAD_PATH', (d) => editWeightMap(d, (m) => { m['model.norm.weight'] = '../model-00002-of-00002.safetensors'; }), '../model-00002');
badCheckpoint('the index names a file that is not .safetensors', 'E_CKPT_INDEX_BAD_PATH', (d) => editWeightMap(d, (m) => { m['model.norm.weight'] = 'config.json'; }), 'config.json');
badCheckpoint('the index lists a tensor twice', 'E_CKPT_INDEX_DUPLICATE', (d) => {
  const text = readFileSync(join(d, INDEX), 'utf8').replace('"weight_map": {', `"weight_map": {\n    "lm_head.weight": "${SHARD1}",`);
  writeIndex(d, text);
}, 'lm_head.weight');
badCheckpoint('no index and no model.safetensors', 'E_CKPT_NO_WEIGHTS', (d) => rmSync(join(d, INDEX)), SHARD1);
badCheckpoint('model.safetensors next to other .safetensors files and no index', 'E_CKPT_UNLISTED_FILE', (d) => {
  rmSync(join(d, INDEX));
  renameSync(join(d, SHARD1), join(d, 'model.safetensors'));
}, SHARD2);
badCheckpoint('no config.json', 'E_CKPT_NO_CONFIG', (d) => rmSync(join(d, 'config.json')), 'config.json');
badCheckpoint('config.json is not JSON', 'E_CKPT_CONFIG', (d) => writeFileSync(join(d, 'config.json'), '{'), 'config.json');
badCheckpoint('config.json without architectures', 'E_CKPT_CONFIG', (d) => writeFileSync(join(d, 'config.json'), '{"hidden_size": 64}'), 'architectures');
badCheckpoint('config.json with a bad head count', 'E_CKPT_CONFIG', (d) => writeFileSync(join(d, 'config.json'), '{"architectures": ["LlamaForCausalLM"], "num_attention_heads": -8}'), 'num_attention_heads');
badCheckpoint('a broken shard fails with its own code and path', 'E_ST_TRAILING_BYTES', (d) => writeFileSync(join(d, SHARD2), Buffer.concat([readFileSync(join(d, SHARD2)), Buffer.from('junk')])), SHARD2);

test('a model directory that does not exist: E_CKPT_DIR', async () => {
  const dir = makeTempDir('nodir');
  try {
    await rejectsWith(() => planCheckpoint(join(dir, 'nope'), { tpSize: 1 }), CheckpointError, 'E_CKPT_DIR', 'nope');
  } finally {
    removeDir(dir);
  }
});

test('files that are not .safetensors (tokenizer, README, a subdirectory) are ignored', async () => {
  const dir = makeTempDir('extra');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM');
    writeFileSync(join(dir, 'tokenizer.json'), '{}');
    writeFileSync(join(dir, 'README.md'), '#');
    mkdirSync(join(dir, 'original'));
    const plan = await planCheckpoint(dir, { tpSize: 1 });
    assert.equal(plan.ranks[0]!.files.map((f) => f.slice(dir.length + 1)), [SHARD1, SHARD2]);
  } finally {
    removeDir(dir);
  }
});

test.run();
