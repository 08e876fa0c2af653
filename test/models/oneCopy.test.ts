// One checkpoint, one copy: a start that lists the same checkpoint twice (a copy of it under
// another name, or the same directory under two names) is refused before anything loads, as
// `ctl load` refuses a checkpoint the daemon serves, naming both entries; exit 2, since only
// the configuration can fix it.
import { cpSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

const dir = freshTempDir();
const copy = join(dir, 'copy-of-tiny');
cpSync(exampleModel, copy, { recursive: true });

function start(...args: string[]) {
  return runCli([...args, '--device', 'host', '--weight-cache-socket-dir', freshSocketDir()]);
}

test('--model A --model copy-of-A: refused at start, naming both', async () => {
  const r = await start('--model', exampleModel, '--model', copy);
  assert.is(r.code, 2, r.stderr);
  assert.match(r.messages, `${copy} at tp 1 ("copy-of-tiny") is already loaded as "tiny-llama" (${exampleModel.replace(/\/$/, '')})`);
  assert.match(r.messages, 'drop one of the two');
  assert.not.match(r.stderr, /READY/);
});

test('a --models file listing one checkpoint twice: refused the same way', async () => {
  const file = join(dir, 'models.json');
  writeFileSync(file, JSON.stringify({ models: [{ name: 'first', dir: exampleModel }, { name: 'second', dir: 'copy-of-tiny' }] }));
  const r = await start('--models', file);
  assert.is(r.code, 2, r.stderr);
  assert.match(r.messages, `${copy} at tp 1 ("second") is already loaded as "first"`);
});

test.run();
