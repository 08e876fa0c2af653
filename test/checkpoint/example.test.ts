// examples/tiny-llama: plans for tp 1, 2, 4 and 8, and the generator reproduces it byte for byte.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { makeExample } from '../../scripts/make-example.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';

const EXAMPLE = fileURLToPath(new URL('../../../examples/tiny-llama', import.meta.url));

test('the example checkpoint plans for tp 1, 2, 4 and 8', async () => {
  for (const tp of [1, 2, 4, 8]) {
    const plan = await planCheckpoint(EXAMPLE, { tpSize: tp });
    assert.is(plan.architecture, 'LlamaForCausalLM');
    assert.is(plan.ranks.length, tp);
    assert.is(plan.ranks[0]!.tensors.length, 39);
  }
});

test('make-example regenerates the committed files exactly', async () => {
  const dir = makeTempDir('example');
  try {
    await makeExample(dir);
    const names = readdirSync(dir).sort();
    assert.equal(names, readdirSync(EXAMPLE).filter((n) => n !== 'README.md').sort());
    for (const n of names) assert.ok(readFileSync(join(dir, n)).equals(readFileSync(join(EXAMPLE, n))), `${n} differs`);
  } finally {
    removeDir(dir);
  }
});

test.run();
