// The daemon's last step ends the process even when a libuv thread is blocked in a call that
// never returns: process.exit() joins the threadpool and would hang there after the clean stop
// had run; endProcess() then ends by the stop signal instead, once the grace for work in flight
// has passed. With nothing blocked the exit code stays (0 after a signal stop), and a request
// that has only just completed is not a blocked thread. No daemon can be made to block a thread from outside (its
// checkpoint and plan files are refused unless regular), so a child runs the same function.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { runFixture } from '../helpers/runFixture.js';

const fixture = fileURLToPath(new URL('./fixtures/blockedExit.js', import.meta.url));

async function run(args: string[]): Promise<{ code: number | null; signal: NodeJS.Signals | null; pending: string[] }> {
  const { code, signal, stdout } = await runFixture(fixture, args);
  return { code, signal, pending: stdout ? (JSON.parse(stdout) as { pending: string[] }).pending : [] };
}

test('a thread blocked on a FIFO open: the process still ends, by the stop signal', async () => {
  const dir = makeTempDir('blocked-exit');
  try {
    const fifo = join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    const ended = await run(['fifo', fifo, 'listener']);
    assert.equal(ended.pending, ['FSReqCallback']);
    assert.is(ended.signal, 'SIGTERM');
  } finally {
    removeDir(dir);
  }
});

test('a request that has just failed is not a blocked thread: the exit code is kept', async () => {
  const ended = await run(['failed-open', 'listener']);
  assert.equal(ended.pending, []);
  assert.is(ended.code, 0);
  assert.is(ended.signal, null);
});

test('nothing blocked: the exit code is kept', async () => {
  const ended = await run(['nothing', 'listener']);
  assert.equal(ended.pending, []);
  assert.is(ended.code, 0);
  assert.is(ended.signal, null);
});

test.run();
