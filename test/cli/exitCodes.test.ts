// The README's exit codes are a contract a supervisor acts on ("stop retrying on 2"), so every
// documented way a start ends gives its code on every run, never a signal. Each case runs
// several times at once, so that the runs load the machine as a busy node would, and all must
// agree. A failed start used to end by SIGKILL (137) whenever a file request was still listed
// as pending at the end: one that had just failed, which is not a blocked thread.
import { execFileSync, spawn } from 'node:child_process';
import { cpSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { READY_LINE } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, freshTempDir, mainJs } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

/** Runs of each case, all at once. */
const RUNS = 3;

const root = freshTempDir();

/** A copy of the example checkpoint, changed by `change`. */
function variant(name: string, change: (dir: string) => void): string {
  const dir = join(root, name);
  cpSync(exampleModel, dir, { recursive: true });
  change(dir);
  return dir;
}

const INDEX = 'model.safetensors.index.json';
const SHARD = 'model-00002-of-00002.safetensors';

function editIndex(dir: string, edit: (weightMap: Record<string, string>) => void): void {
  const index = JSON.parse(readFileSync(join(dir, INDEX), 'utf8')) as { weight_map: Record<string, string> };
  edit(index.weight_map);
  writeFileSync(join(dir, INDEX), JSON.stringify(index));
}

const failures: Array<[string, string[], number, RegExp]> = [
  ['no config.json', ['--model', variant('no-config', (d) => rmSync(join(d, 'config.json')))], 1, /E_CKPT_NO_CONFIG/],
  ['an index naming a missing shard', ['--model', variant('missing-shard', (d) => rmSync(join(d, SHARD)))], 1, /E_CKPT_INDEX_MISSING_FILE/],
  [
    'a shard linked to /dev/zero',
    ['--model', variant('dev-zero', (d) => (rmSync(join(d, SHARD)), symlinkSync('/dev/zero', join(d, SHARD))))],
    1,
    /is a character device/,
  ],
  ['a FIFO index', ['--model', variant('fifo-index', (d) => (rmSync(join(d, INDEX)), execFileSync('mkfifo', [join(d, INDEX)])))], 1, /is a FIFO/],
  [
    '10,000 unlisted shards',
    ['--model', variant('unlisted', (d) => Array.from({ length: 10_000 }, (_, i) => writeFileSync(join(d, `extra-${i}.safetensors`), '')))],
    1,
    /E_CKPT_UNLISTED_FILE.*extra-\d+\.safetensors and 9990 more are not in/,
  ],
  [
    'an index entry sub/../x',
    ['--model', variant('dot-dot', (d) => editIndex(d, (m) => (m[Object.keys(m)[0]!] = `sub/../${m[Object.keys(m)[0]!]}`)))],
    1,
    /E_CKPT_INDEX_BAD_PATH/,
  ],
  ['a bad flag', ['--model', exampleModel, '--nnodes', '0'], 2, /--nnodes 0/],
  ["a tp size the model's shapes do not divide", ['--model', exampleModel, '-tp', '3'], 2, /not divisible by tp size 3/],
];

for (const [name, args, code, message] of failures) {
  test(`${name}: exit ${code} on each of ${RUNS} runs at once`, async () => {
    const runs = await Promise.all(Array.from({ length: RUNS }, () => runCli([...args, '--device', 'host'], { timeoutMs: 60_000 })));
    for (const r of runs) {
      assert.equal({ code: r.code, signal: r.signal }, { code, signal: null }, r.messages.slice(-2000));
      assert.match(r.stderr, message);
      assert.not.match(r.messages, /threads are still blocked/);
    }
  });
}

/** Starts the example, and once it is READY stops it with `signal`; resolves with how it ended. */
function stopAfterReady(signal: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }> {
  const child = spawn(process.execPath, [mainJs, '--model', exampleModel, '--device', 'host', '--weight-cache-socket-dir', freshSocketDir()], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  let signalled = false;
  child.stderr.on('data', (d) => {
    stderr += d;
    // Once: a second signal after the stop is a second request, which a test must not make.
    if (!signalled && READY_LINE.test(stderr)) child.kill(signal), (signalled = true);
  });
  const bound = setTimeout(() => child.kill('SIGKILL'), 60_000);
  return new Promise((resolve) =>
    child.on('close', (code, ended) => {
      clearTimeout(bound);
      resolve({ code, signal: ended, stderr });
    }),
  );
}

for (const signal of ['SIGTERM', 'SIGHUP'] as const) {
  test(`stopped by ${signal} once serving: exit 0 on each of ${RUNS} runs at once`, async () => {
    const runs = await Promise.all(Array.from({ length: RUNS }, () => stopAfterReady(signal)));
    for (const r of runs) assert.equal({ code: r.code, signal: r.signal }, { code: 0, signal: null }, r.stderr.slice(-2000));
  });
}

test.run();
