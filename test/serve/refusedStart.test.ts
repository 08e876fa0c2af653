// A refused start leaves nothing behind: no socket directory (nor the parents made for it), no
// lock, socket or node.json, and no keeper it spawned waiting for a daemon that is gone. Each
// case starts the CLI under a fresh parent directory and compares what is there afterwards.
import { chownSync, cpSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import { asRoot } from '../helpers/asRoot.js';
import * as assert from 'uvu/assert';
import { isProcessAlive } from '../../src/wire/processLiveness.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshTempDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';


/** Every path under `dir`, relative to it. */
function tree(dir: string): string[] {
  return (readdirSync(dir, { recursive: true }) as string[]).sort();
}

function daemon(socketDir: string, ...extra: string[]) {
  const model = extra.includes('--model') ? [] : ['--model', exampleModel];
  return runCli([...model, '--device', 'host', '--weight-cache-socket-dir', socketDir, ...extra], { env: { WEIGHTD_HOST_DEVICES: `refused-${process.pid}` } });
}

asRoot(test, 'E_SOCKET_DIR_ANCESTOR: nothing is made inside the other user\'s directory', 'only root can make a directory someone else owns', async () => {
  const parent = freshTempDir();
  mkdirSync(join(parent, 'theirs'));
  chownSync(join(parent, 'theirs'), 12345, 12345);
  const r = await daemon(join(parent, 'theirs', 'mine', 'sockets'));
  assert.is(r.code, 1, r.stderr);
  assert.match(r.stderr, 'E_SOCKET_DIR_ANCESTOR');
  assert.equal(tree(parent), ['theirs']);
});

test('E_SOCKET_PATH_TOO_LONG: the directory and the parents made for it are removed', async () => {
  const parent = freshTempDir();
  const r = await daemon(join(parent, 'made', 'x'.repeat(100)));
  assert.is(r.code, 1, r.stderr);
  assert.match(r.stderr, 'E_SOCKET_PATH_TOO_LONG');
  assert.equal(tree(parent), []);
});

test('a checkpoint refused after the control socket is up: no socket, lock or directory stays', async () => {
  const parent = freshTempDir();
  const model = join(freshTempDir(), 'no-config');
  cpSync(exampleModel, model, { recursive: true });
  rmSync(join(model, 'config.json'));
  const r = await daemon(join(parent, 's'), '--model', model);
  assert.is(r.code, 1, r.stderr);
  assert.match(r.stderr, 'E_CKPT_NO_CONFIG');
  assert.equal(tree(parent), []);
});

test('E_DEVICE_LOCKED: the refused daemon leaves the serving one\'s files as they were', async () => {
  const parent = freshTempDir();
  const socketDir = join(parent, 's');
  const devices = [`locked-${process.pid}`];
  const first = await startDaemon({ model: exampleModel, socketDir, devices });
  try {
    const before = tree(parent);
    const r = await runCli(['--model', exampleModel, '--device', 'host', '--weight-cache-socket-dir', socketDir], { env: { WEIGHTD_HOST_DEVICES: devices[0]! } });
    assert.is(r.code, 1, r.stderr);
    assert.match(r.stderr, 'E_DEVICE_LOCKED');
    assert.equal(tree(parent), before);
  } finally {
    await first.stop();
  }
  assert.equal(tree(parent), []);
});

test('E_INSPECT_BIND with --keeper spawn: the keeper spawned for the start does not wait for it', async () => {
  const parent = freshTempDir();
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
  const port = (holder.address() as { port: number }).port;
  try {
    const r = await daemon(join(parent, 's'), '--inspect-port', String(port), '--keeper', 'spawn');
    assert.is(r.code, 2, r.stderr);
    assert.match(r.stderr, 'E_INSPECT_BIND');
    const started = /"pid":(\d+)[^\n]*"msg":"started a keeper"/.exec(r.stderr);
    assert.ok(started, r.stderr);
    {
      // It got the daemon's WATCH and saw it close, so it exits at once, empty; unwatched it
      // would wait the whole --adopt-within (600 s). The daemon waits for its exit.
      const pid = Number(started![1]);
      const until = Date.now() + 15_000;
      while (isProcessAlive({ pid }) && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 20));
      assert.not.ok(isProcessAlive({ pid }), `keeper ${pid} still runs`);
    }
    // The keeper's log this start created went once the keeper exited, and with it the socket directory.
    assert.equal(tree(parent), []);
  } finally {
    holder.close();
  }
});

test('a refused --keeper spawn start leaves a keeper log it did not create', async () => {
  const parent = freshTempDir();
  const dir = join(parent, 's');
  mkdirSync(dir, { mode: 0o700 });
  writeFileSync(join(dir, 'keeper.log'), 'an earlier keeper\n', { mode: 0o600 });
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
  try {
    const r = await daemon(dir, '--inspect-port', String((holder.address() as { port: number }).port), '--keeper', 'spawn');
    assert.is(r.code, 2, r.stderr);
    assert.match(r.stderr, 'started a keeper');
    assert.equal(tree(parent), ['s', join('s', 'keeper.log')]);
    assert.ok(readFileSync(join(dir, 'keeper.log'), 'utf8').startsWith('an earlier keeper\n'));
  } finally {
    holder.close();
  }
});

test.run();
