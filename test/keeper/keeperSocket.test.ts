// The keeper's socket and its peers: one keeper per socket (a second exits 3, a stale socket is
// replaced), a directory others could write is refused, a client of another uid is closed
// without a reply, and SIGTERM stops it with exit 0 and its socket removed.
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { errorCode } from '../../src/errors.js';
import { KeeperClient, keeperBinaryPath } from '../../src/keeper/keeperClient.js';
import { encodePing } from '../../src/keeper/keeperProtocol.js';
import { mainJs } from '../helpers/paths.js';
import { processAlive, startTestKeeper, waitUntil } from '../helpers/keeper.js';

const THROWAWAY_UID = 48611; // no account uses it (test/native/resourceLimits.test.ts)

function runKeeperSync(args: string[]) {
  return spawnSync(keeperBinaryPath, args, { encoding: 'utf8', timeout: 20_000 });
}

test('its socket is 0600; a second keeper on a live socket exits 3 saying so, and the first serves on', async () => {
  const keeper = await startTestKeeper();
  try {
    assert.is(statSync(keeper.socket).mode & 0o777, 0o600);
    const second = runKeeperSync(['--socket', keeper.socket]);
    assert.is(second.status, 3);
    assert.match(second.stderr, new RegExp(`a keeper already serves ${keeper.socket}`));
    // The same through the CLI, which passes the keeper's exit code on.
    const cli = spawnSync(process.execPath, [mainJs, 'keeper', '--socket', keeper.socket], { encoding: 'utf8', timeout: 20_000 });
    assert.is(cli.status, 3, cli.stderr);
    assert.is((await keeper.client.ping()).pid, keeper.pid);
  } finally {
    await keeper.kill();
  }
});

test('a stale socket (its keeper was killed) is replaced', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  try {
    const first = await startTestKeeper([], { dir });
    await first.kill();
    assert.ok(existsSync(first.socket), 'SIGKILL left the socket file');
    const second = await startTestKeeper([], { dir });
    try {
      assert.is((await second.client.ping()).pid, second.pid);
    } finally {
      await second.kill();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a socket directory writable by group or others is refused with exit 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  try {
    chmodSync(dir, 0o770);
    const r = runKeeperSync(['--socket', join(dir, 'k.sock')]);
    assert.is(r.status, 2);
    assert.match(r.stderr, /has mode 0770, writable by group or others: chmod go-w it/);
    assert.not.ok(existsSync(join(dir, 'k.sock')));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bad flags exit 2 with what was wrong', () => {
  assert.match(runKeeperSync([]).stderr, /--socket PATH is required/);
  const r = runKeeperSync(['--socket', '/tmp/x.sock', '--adopt-within', '-1']);
  assert.is(r.status, 2);
  assert.match(r.stderr, /--adopt-within -1 is not a number of seconds/);
  const zero = runKeeperSync(['--socket', '/tmp/x.sock', '--request-timeout', '0']);
  assert.is(zero.status, 2);
  assert.match(zero.stderr, /--request-timeout 0 is not a number of seconds \(above 0 to 1e9/);
});

test('a client of another uid is closed without a reply, and the keeper logs why', async () => {
  if (process.getuid?.() !== 0) {
    console.log('  (skipped: needs root to run the keeper as a throwaway uid)');
    return;
  }
  // The keeper runs as the throwaway uid; this process (root, which may connect to any socket)
  // is then the foreign peer.
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-uid-'));
  chownSync(dir, THROWAWAY_UID, THROWAWAY_UID);
  const keeper = await startTestKeeper([], { dir, prefix: ['setpriv', `--reuid=${THROWAWAY_UID}`, `--regid=${THROWAWAY_UID}`, '--clear-groups'] });
  try {
    const got = await new Promise<Buffer>((resolve, reject) => {
      const chunks: Buffer[] = [];
      const s = connect(keeper.socket);
      s.on('data', (d) => chunks.push(d));
      // Closed with the request unread, the connection is reset rather than ended (or closed before
      // the write, EPIPE): either way, no reply.
      s.on('error', (err) => (errorCode(err) === 'ECONNRESET' || errorCode(err) === 'EPIPE' ? undefined : reject(err)));
      s.on('connect', () => s.write(encodePing()));
      s.on('close', () => resolve(Buffer.concat(chunks)));
    });
    assert.is(got.length, 0, 'no reply to a foreign uid');
    await waitUntil('the keeper logs the refusal', () => keeper.stderr().includes('refused a client of another uid'));
    assert.match(keeper.stderr(), /"peerUid":0,.*"uid":48611/);
  } finally {
    await keeper.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('weightd keeper runs the keeper in the foreground: a SIGTERM to weightd reaches it, and both exit 0', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  const socket = join(dir, 'keeper.sock');
  const cli = spawn(process.execPath, [mainJs, 'keeper', '--socket', socket], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  cli.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => cli.on('exit', (code) => resolve(code)));
  try {
    await waitUntil(() => `the keeper serves (stderr: ${stderr})`, () => stderr.includes('"msg":"keeper serving"'));
    cli.kill('SIGTERM');
    assert.is(await exited, 0, stderr);
    assert.match(stderr, /"msg":"stopping on a signal: every kept record is freed","signal":15/);
    assert.not.ok(existsSync(socket));
  } finally {
    cli.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test("weightd keeper passes the keeper's deadlines on (--request-timeout, --idle-timeout), and a bad one exits 2 naming it", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  const socket = join(dir, 'keeper.sock');
  const cli = spawn(process.execPath, [mainJs, 'keeper', '--socket', socket, '--request-timeout', '2.5', '--idle-timeout', '0.5'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  cli.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => cli.on('exit', (code) => resolve(code)));
  try {
    await waitUntil(() => `the keeper serves (stderr: ${stderr})`, () => stderr.includes('"msg":"keeper serving"'));
    assert.match(stderr, /"requestTimeoutMs":2500,"idleTimeoutMs":500/);
    const idle = connect(socket);
    await new Promise<void>((resolve) => idle.on('close', () => resolve()));
    assert.match(stderr, /closed a client that sent nothing within the idle timeout","timeoutMs":500/);
    cli.kill('SIGTERM');
    assert.is(await exited, 0, stderr);
  } finally {
    cli.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
  const bad = spawnSync(process.execPath, [mainJs, 'keeper', '--socket', socket, '--request-timeout', '0'], { encoding: 'utf8', timeout: 20_000 });
  assert.is(bad.status, 2, bad.stderr);
  assert.match(bad.stderr, /--request-timeout 0 is not a number of seconds \(above 0 to 1e9, e.g. 600 or 0.5\)/);
});

test('weightd keeper killed with SIGKILL (which it cannot forward): its keeper stops too, frees its records and removes its socket', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  const socket = join(dir, 'keeper.sock');
  const cli = spawn(process.execPath, [mainJs, 'keeper', '--socket', socket], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  cli.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<NodeJS.Signals | null>((resolve) => cli.on('exit', (_code, signal) => resolve(signal)));
  let keeperPid: number | undefined;
  try {
    await waitUntil(() => `the keeper serves (stderr: ${stderr})`, () => stderr.includes('"msg":"keeper serving"'));
    keeperPid = (await new KeeperClient(socket).ping()).pid;
    assert.is.not(keeperPid, cli.pid);
    cli.kill('SIGKILL');
    assert.is(await exited, 'SIGKILL');
    await waitUntil(() => `keeper ${keeperPid} ends after its parent (stderr: ${stderr})`, () => !processAlive(keeperPid!));
    assert.not.ok(existsSync(socket), 'the keeper stopped as on SIGTERM, removing its socket');
  } finally {
    cli.kill('SIGKILL');
    if (keeperPid !== undefined && processAlive(keeperPid)) process.kill(keeperPid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--stop-with-parent naming a process that is not its parent is refused (exit 1), and a bad pid with exit 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  try {
    const r = runKeeperSync(['--socket', join(dir, 'k.sock'), '--stop-with-parent', '1']);
    assert.is(r.status, 2, r.stderr);
    assert.match(r.stderr, /--stop-with-parent 1 is not a process id/);
    const other = runKeeperSync(['--socket', join(dir, 'k.sock'), '--stop-with-parent', String(process.ppid)]);
    assert.is(other.status, 1, other.stderr);
    assert.match(other.stderr, new RegExp(`--stop-with-parent ${process.ppid}: that process is not this keeper's parent`));
    assert.not.ok(existsSync(join(dir, 'k.sock')));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('SIGTERM: exit 0, the socket removed', async () => {
  const keeper = await startTestKeeper();
  try {
    process.kill(keeper.pid, 'SIGTERM');
    assert.equal(await keeper.exited, { code: 0, signal: null });
    assert.not.ok(existsSync(keeper.socket));
    assert.match(keeper.stderr(), /"msg":"stopping on a signal: every kept record is freed","signal":15/);
  } finally {
    await keeper.kill();
  }
});

test.run();
