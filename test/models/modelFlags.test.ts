// How several models are configured: repeated --model with one -tp for all or one per model, or
// a --models file checked against its schema (docs/operations.md, "Several models"); each bad
// value names the flag or the file, what is wrong and what to do.
import { cpSync, writeFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseArgs } from '../../src/cli/parseArgs.js';
import { UsageError } from '../../src/errors.js';
import { resolveNodeOptions } from '../../src/nodeOptions.js';
import { exampleModel, freshTempDir } from '../helpers/paths.js';

const dir = freshTempDir();
const draft = `${dir}/draft`;
cpSync(exampleModel, draft, { recursive: true });

function refusal(run: () => unknown): UsageError {
  try {
    run();
  } catch (err) {
    assert.instance(err, UsageError);
    return err as UsageError;
  }
  return assert.unreachable('expected a UsageError') as never;
}

async function refused(p: Promise<unknown>): Promise<UsageError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  assert.instance(err, UsageError);
  return err as UsageError;
}

test('repeated --model: one -tp for every model, or one per model in order; other counts are refused', async () => {
  const one = parseArgs(['--model', exampleModel, '--model', draft, '-tp', '2']);
  assert.equal([one.model, one.tensorParallelSize, one.models], [exampleModel, 2, [{ model: draft, tensorParallelSize: 2 }]]);
  const each = parseArgs(['--model', exampleModel, '-tp', '2', '--model', draft, '-tp', '1']);
  assert.equal([each.tensorParallelSize, each.models], [2, [{ model: draft, tensorParallelSize: 1 }]]);
  const config = await resolveNodeOptions(each);
  assert.equal(config.models.map((m) => [m.name, m.tpSize]), [['tiny-llama', 2], ['draft', 1]]);
  assert.equal([config.models[0].name, config.tpSize, config.models[0].modelDir], ['tiny-llama', 2, exampleModel.replace(/\/$/, '')]);
  const counts = refusal(() => parseArgs(['--model', exampleModel, '--model', draft, '--model', draft, '-tp', '1', '-tp', '2']));
  assert.match(counts.message, /--tensor-parallel-size is given 2 times for 3 --model\(s\); give it once for all of them, or once per --model in the same order/);
});

test('--models FILE: validated against its schema, directories relative to the file, exclusive of --model', async () => {
  const file = `${dir}/models.json`;
  writeFileSync(file, JSON.stringify({ models: [{ name: 'main', dir: exampleModel, tensorParallelSize: 2 }, { dir: 'draft', layouts: ['vllm'] }] }));
  const config = await resolveNodeOptions(parseArgs(['--models', file]));
  assert.equal(config.models.map((m) => [m.name, m.modelDir, m.tpSize, m.layouts]), [
    ['main', exampleModel.replace(/\/$/, ''), 2, []],
    ['draft', draft, 1, ['vllm']],
  ]);
  const cases: Array<[unknown, RegExp]> = [
    [{ models: [{ dir: exampleModel, tp: 2 }] }, /does not match the models schema: models\.0: Unrecognized key: "tp"; see docs\/operations\.md \(Several models\)/],
    [{ models: [] }, /does not match the models schema: models: Too small/],
    [{ models: [{ dir: exampleModel, name: '../x' }] }, /models\.0\.name: a model name is 1-128 letters/],
    [{ models: [{ dir: exampleModel, tensorParallelSize: 0 }] }, /models\.0\.tensorParallelSize: Too small/],
    [{ models: [{ dir: exampleModel }, { dir: `${dir}/nowhere` }] }, /--model ".*nowhere": cannot be read \(ENOENT\)/],
    [{ models: [{ dir: exampleModel }, { dir: draft, name: 'tiny-llama' }] }, /has the same name "tiny-llama" as .*tiny-llama; give each model its own name/],
  ];
  for (const [content, pattern] of cases) {
    writeFileSync(file, JSON.stringify(content));
    assert.match((await refused(resolveNodeOptions({ model: '', modelsFile: file }))).message, pattern);
  }
  writeFileSync(file, '{ "models": [');
  assert.match((await refused(resolveNodeOptions({ model: '', modelsFile: file }))).message, /--models ".*models\.json": is not JSON/);
  assert.match((await refused(resolveNodeOptions({ model: '', modelsFile: `${dir}/absent.json` }))).message, /--models ".*absent\.json": cannot be read \(ENOENT\)/);
  assert.match((await refused(resolveNodeOptions({ model: exampleModel, modelsFile: file }))).message, /--models ".*": comes with model; give every model, with its tp size and plan file, in the --models file, or use --model without it/);
});

test.run();
