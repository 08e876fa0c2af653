// --layouts reaches the node options; a layout weightd does not plan exits 2 before anything starts.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseArgs } from '../../src/cli/parseArgs.js';
import { exampleModel } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

const m = ['--model', exampleModel];

test('--layouts is parsed as a comma-separated list, checkpoint by default', () => {
  assert.equal(parseArgs(m).layouts, ['checkpoint']);
  assert.equal(parseArgs([...m, '--layouts', 'checkpoint, vllm']).layouts, ['checkpoint', 'vllm']);
});

test('an unknown layout is a usage error naming it and the layouts there are', async () => {
  const r = await runCli([...m, '--layouts', 'checkpoint,sglang']);
  assert.is(r.code, 2, r.stderr);
  assert.match(r.stderr, /--layouts .*sglang.*: names a layout weightd does not plan.*checkpoint, vllm/);
  assert.not.match(r.stderr, /READY/);
});

test.run();
