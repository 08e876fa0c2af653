// Checkpoint files that are not what they claim: FIFOs (which block open(2) until a writer comes),
// character devices (which read forever), files far larger than they can be, and JSON nested
// deep enough to exhaust the parser. Each must fail at once, naming the path and what is wrong.
import { execFileSync } from 'node:child_process';
import { rmSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { findDuplicateJsonKey } from '../../src/checkpoint/findDuplicateJsonKey.js';
import { MAX_CONFIG_BYTES } from '../../src/files/openRegularFile.js';
import { MAX_JSON_DEPTH, tooDeepAt } from '../../src/files/parseBoundedJson.js';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { readPlanFile } from '../../src/checkpoint/readPlanFile.js';
import { CheckpointError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeRawSafetensors } from '../helpers/checkpoints.js';

const INDEX = 'model.safetensors.index.json';
const SHARD1 = 'model-00001-of-00002.safetensors';

const mkfifo = (path: string) => execFileSync('mkfifo', [path]);
const replace = (path: string, make: (p: string) => void) => {
  rmSync(path);
  make(path);
};

/** A valid checkpoint (two shards, or one), changed by `mutate`, must fail planning with `code`, naming `mentions`. */
function hostile(name: string, shards: 1 | 2, mutate: (dir: string) => void, code: string, ...mentions: Array<string | ((dir: string) => string)>): void {
  test(`${name}: ${code}`, async () => {
    const dir = makeTempDir('hostile');
    try {
      await writeArchCheckpoint(dir, 'LlamaForCausalLM', { shards });
      mutate(dir);
      await rejectsWith(() => planCheckpoint(dir, { tpSize: 1 }), CheckpointError, code, ...mentions.map((m) => (typeof m === 'string' ? m : m(dir))));
    } finally {
      removeDir(dir);
    }
  });
}

hostile('model.safetensors is a FIFO', 1, (d) => replace(join(d, 'model.safetensors'), mkfifo), 'E_FILE_NOT_REGULAR', (d) => join(d, 'model.safetensors'), 'FIFO');
hostile('model.safetensors links to a FIFO', 1, (d) => {
  mkfifo(join(d, 'pipe'));
  replace(join(d, 'model.safetensors'), (p) => symlinkSync(join(d, 'pipe'), p));
}, 'E_FILE_NOT_REGULAR', 'FIFO');
hostile('a shard listed in the index is a FIFO', 2, (d) => replace(join(d, SHARD1), mkfifo), 'E_FILE_NOT_REGULAR', SHARD1, 'FIFO');
hostile('the index is a FIFO', 2, (d) => replace(join(d, INDEX), mkfifo), 'E_FILE_NOT_REGULAR', INDEX, 'FIFO');
hostile('config.json is a FIFO', 1, (d) => replace(join(d, 'config.json'), mkfifo), 'E_FILE_NOT_REGULAR', 'config.json', 'FIFO');
hostile('config.json links to /dev/zero', 1, (d) => replace(join(d, 'config.json'), (p) => symlinkSync('/dev/zero', p)), 'E_FILE_NOT_REGULAR', 'config.json', 'character device');
hostile('config.json is larger than any config', 1, (d) => truncateSync(join(d, 'config.json'), MAX_CONFIG_BYTES + 1), 'E_FILE_TOO_LARGE', 'config.json', String(MAX_CONFIG_BYTES + 1));
hostile('config.json nested past the bound', 1, (d) => writeFileSync(join(d, 'config.json'), `{"architectures":["LlamaForCausalLM"],"x":${'['.repeat(1_000_000)}${']'.repeat(1_000_000)}}`), 'E_CKPT_CONFIG', `nested ${MAX_JSON_DEPTH} levels`);
hostile('the index nested 80 KB deep', 2, (d) => writeFileSync(join(d, INDEX), `{"weight_map":{},"m":${'['.repeat(80_000)}${']'.repeat(80_000)}}`), 'E_CKPT_INDEX_JSON', `nested ${MAX_JSON_DEPTH} levels`);

test('a plan file that is a FIFO: E_FILE_NOT_REGULAR', async () => {
  const dir = makeTempDir('hostile');
  try {
    mkfifo(join(dir, 'plan.json'));
    await rejectsWith(() => readPlanFile(join(dir, 'plan.json')), CheckpointError, 'E_FILE_NOT_REGULAR', 'plan.json', 'FIFO');
  } finally {
    removeDir(dir);
  }
});

test('a safetensors header of 80 KB of nested brackets fails as JSON, not by exhausting the heap', async () => {
  const dir = makeTempDir('hostile');
  try {
    const path = join(dir, 'deep.safetensors');
    await writeRawSafetensors(path, `{"a":${'['.repeat(40_000)}${']'.repeat(40_000)}}`);
    await rejectsWith(() => parseSafetensors(path), CheckpointError, 'E_ST_HEADER_JSON', path, `nested ${MAX_JSON_DEPTH} levels`);
  } finally {
    removeDir(dir);
  }
});

test('the nesting bound is serde_json\'s: 127 levels pass, 128 fail, brackets inside strings do not count', () => {
  const nest = (n: number) => '['.repeat(n) + ']'.repeat(n);
  assert.is(tooDeepAt(nest(MAX_JSON_DEPTH - 1)), -1);
  assert.is(tooDeepAt(nest(MAX_JSON_DEPTH)), MAX_JSON_DEPTH - 1);
  assert.is(tooDeepAt(`["${'['.repeat(500)}\\"${'{'.repeat(500)}"]`), -1);
});

test('the duplicate-key scan is linear: 200k levels deep, the duplicate at the bottom is found with its path', () => {
  const depth = 200_000;
  const text = '{"k":'.repeat(depth) + '{"a":1,"a":2}' + '}'.repeat(depth);
  const dup = findDuplicateJsonKey(text);
  assert.is(dup?.key, 'a');
  assert.is(dup?.path.length, depth);
  assert.ok(dup!.path.every((k) => k === 'k'));
  assert.equal(findDuplicateJsonKey('{"x":[{"a":1},{"a":2}],"y":{"b":[[{"c":1,"c":2}]]}}'), { path: ['y', 'b', '[]', '[]'], key: 'c' });
});

test.run();
