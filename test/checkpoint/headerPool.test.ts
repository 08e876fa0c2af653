// Header parsing in the piscina pool: same results as parsing inline, errors keep their class
// and code across the thread boundary, and a pool given by the caller is used and left open.
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { createHeaderPool, INLINE_PARSE_MAX_FILES, parseShards } from '../../src/checkpoint/parseShards.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { CheckpointError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir, writeArchCheckpoint } from '../helpers/checkpoints.js';

const SHARDS = 6;
let dir = '';
let paths: string[] = [];
test.before(async () => {
  dir = makeTempDir('pool');
  await writeArchCheckpoint(dir, 'Qwen3MoeForCausalLM', { shards: SHARDS });
  paths = Array.from({ length: SHARDS }, (_, i) => join(dir, `model-0000${i + 1}-of-0000${SHARDS}.safetensors`));
});
test.after(() => removeDir(dir));

test(`more than ${INLINE_PARSE_MAX_FILES} shards go through a pool and parse as inline does`, async () => {
  assert.ok(SHARDS > INLINE_PARSE_MAX_FILES);
  const pooled = await parseShards(paths);
  const inline = await Promise.all(paths.map(parseSafetensors));
  assert.equal(pooled, inline);
});

test('a caller-supplied pool runs every shard and stays usable afterwards', async () => {
  const pool = createHeaderPool(2);
  try {
    const plan = await planCheckpoint(dir, { tpSize: 2, pool });
    // Per shard, one task parses its header and one samples its tensor bytes.
    assert.is(pool.completed, 2 * SHARDS);
    const again = await planCheckpoint(dir, { tpSize: 2, pool });
    assert.is(again.fingerprint, plan.fingerprint);
    // Even a small checkpoint uses the pool it is given.
    await parseShards(paths.slice(0, 1), pool);
    assert.is(pool.completed, 4 * SHARDS + 1);
  } finally {
    await pool.destroy();
  }
});

test('an error raised in a worker arrives as the same CheckpointError with its code', async () => {
  const broken = join(dir, 'model-00004-of-00006.safetensors');
  appendFileSync(broken, 'trailing');
  try {
    await rejectsWith(() => parseShards(paths), CheckpointError, 'E_ST_TRAILING_BYTES', broken);
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 2 }), CheckpointError, 'E_ST_TRAILING_BYTES', broken);
  } finally {
    await writeArchCheckpoint(dir, 'Qwen3MoeForCausalLM', { shards: SHARDS });
  }
});

test.run();
