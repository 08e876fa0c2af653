// The socket directory and device lock, against real daemon processes: unsafe directories are
// refused with an error naming the path and the fix; a second daemon for a device fails fast
// naming the holder while the first keeps serving; a SIGKILLed daemon's socket and lock are
// taken over; a socket that still accepts is never unlinked; other users are refused.
import { spawn } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { test } from 'uvu';
import { asRoot } from '../helpers/asRoot.js';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { removeSocketDirIfCreated, resolveSocketDir, socketPathFor } from '../../src/wire/socketDir.js';
import { ServeError } from '../../src/errors.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { expectDaemonFailure, READY_LINE, startDaemon, type Daemon } from '../helpers/daemon.js';
import { exampleModel, mainJs } from '../helpers/paths.js';
import { spawnUnreaped } from '../helpers/unreaped.js';
import { runClient } from '../client/runClient.js';

/** A failure must come before any loading would: well under this. */
const FAST_MS = 10_000;

async function canAttach(socketDir: string): Promise<void> {
  const socket = await findSocket({ socketDir, globalRank: 0 });
  const got = await runClient<{ tensors: Record<string, unknown> }>('ts', 'hashes', socket, await expectedFingerprint(exampleModel, 1, 0), 'map');
  assert.ok(Object.keys(got.tensors).length > 0);
}

test('the default directory is created 0700 under TMPDIR, sockets 0600', async () => {
  const tmp = makeTempDir('tmpdir');
  let daemon: Daemon | undefined;
  try {
    daemon = await startDaemon({ model: exampleModel, env: { TMPDIR: tmp } });
    const dir = `${tmp}/weightd-${process.getuid!()}`;
    assert.is(statSync(dir).mode & 0o777, 0o700);
    const socket = socketPathFor(dir, daemon.devices[0]!);
    assert.is(statSync(socket).mode & 0o777, 0o600);
    await canAttach(dir);
    await daemon.stop();
    assert.not.ok(existsSync(dir), 'the daemon removes the directory it created');
  } finally {
    await daemon?.stop();
    removeDir(tmp);
  }
});

test('a default directory open to group or others is refused, naming the fix', async () => {
  const tmp = makeTempDir('tmpdir');
  try {
    const dir = `${tmp}/weightd-${process.getuid!()}`;
    mkdirSync(dir, { mode: 0o755 });
    chmodSync(dir, 0o755);
    const r = await expectDaemonFailure({ model: exampleModel, env: { TMPDIR: tmp } });
    assert.is.not(r.code, 0);
    assert.match(r.stderr, `${dir} has mode 0755`);
    assert.match(r.stderr, `chmod 700 ${dir}`);
  } finally {
    removeDir(tmp);
  }
});

test('a chosen directory writable by others is refused; readable is allowed', async () => {
  const tmp = makeTempDir('sockdir');
  let daemon: Daemon | undefined;
  try {
    chmodSync(tmp, 0o775);
    const r = await expectDaemonFailure({ model: exampleModel, socketDir: tmp });
    assert.match(r.stderr, `chmod go-w ${tmp}`);
    chmodSync(tmp, 0o755);
    daemon = await startDaemon({ model: exampleModel, socketDir: tmp });
    await canAttach(tmp);
  } finally {
    await daemon?.stop();
    removeDir(tmp);
  }
});

test('a symlinked socket directory is refused, naming link and target', async () => {
  const tmp = makeTempDir('symlink');
  try {
    mkdirSync(`${tmp}/real`, { mode: 0o700 });
    symlinkSync(`${tmp}/real`, `${tmp}/link`);
    const r = await expectDaemonFailure({ model: exampleModel, socketDir: `${tmp}/link` });
    assert.is.not(r.code, 0);
    assert.match(r.stderr, `${tmp}/link is a symbolic link (to ${tmp}/real)`);
    assert.equal(readdirSync(`${tmp}/real`), [], 'nothing created behind the link');
    // The default directory too (TMPDIR/weightd-<uid> planted as a link).
    symlinkSync(`${tmp}/real`, `${tmp}/weightd-${process.getuid!()}`);
    const d = await expectDaemonFailure({ model: exampleModel, env: { TMPDIR: tmp } });
    assert.match(d.stderr, 'is a symbolic link');
  } finally {
    removeDir(tmp);
  }
});

asRoot(test, 'a directory owned by another user is refused', 'only root can make a directory someone else owns', async () => {
  const tmp = makeTempDir('owner');
  try {
    chownSync(tmp, 65534, 65534);
    chmodSync(tmp, 0o700);
    const r = await expectDaemonFailure({ model: exampleModel, socketDir: tmp });
    assert.match(r.stderr, `${tmp} is owned by uid 65534, not by this user`);
  } finally {
    removeDir(tmp);
  }
});

/** The ServeError resolveSocketDir throws for `dir`. */
function refusal(dir: string): ServeError {
  try {
    resolveSocketDir(dir);
  } catch (err) {
    assert.instance(err, ServeError);
    return err as ServeError;
  }
  return assert.unreachable(`${dir} was accepted`) as never;
}

asRoot(test, 'every ancestor must be owned by root or this user, and not writable by others without the sticky bit', 'only root can make a directory someone else owns', () => {
  const tmp = makeTempDir('ancestor');
  try {
    mkdirSync(`${tmp}/theirs/mine`, { recursive: true, mode: 0o700 });
    chownSync(`${tmp}/theirs`, 12345, 12345);
    let e = refusal(`${tmp}/theirs/mine`);
    assert.is(e.code, 'E_SOCKET_DIR_ANCESTOR');
    assert.match(e.message, `is inside ${tmp}/theirs, which is owned by uid 12345`);
    // The same through a link: the real path's ancestors count.
    symlinkSync(`${tmp}/theirs`, `${tmp}/alias`);
    assert.is(refusal(`${tmp}/alias/mine`).code, 'E_SOCKET_DIR_ANCESTOR');
    // Several levels up, and not created when refused.
    assert.is(refusal(`${tmp}/theirs/mine/a/b`).code, 'E_SOCKET_DIR_ANCESTOR');
    assert.not.ok(existsSync(`${tmp}/theirs/mine/a`), 'nothing made inside their directory');
    assert.is(refusal(`${tmp}/alias/mine/a`).code, 'E_SOCKET_DIR_ANCESTOR');
    assert.not.ok(existsSync(`${tmp}/theirs/mine/a`), 'nor through a link to it');

    mkdirSync(`${tmp}/open/mine`, { recursive: true, mode: 0o700 });
    chmodSync(`${tmp}/open`, 0o777);
    e = refusal(`${tmp}/open/mine`);
    assert.is(e.code, 'E_SOCKET_DIR_ANCESTOR');
    assert.match(e.message, `${tmp}/open, which has mode 0777`);
    chmodSync(`${tmp}/open`, 0o1777); // sticky, as /tmp: others cannot rename what is ours
    assert.is(resolveSocketDir(`${tmp}/open/mine`), `${tmp}/open/mine`);
  } finally {
    removeDir(tmp);
  }
});

test('a shared directory such as /tmp is refused with a private directory to use, never a chmod of it', () => {
  const e = refusal('/tmp');
  assert.is(e.code, 'E_SOCKET_DIR_MODE');
  assert.not.match(e.message, 'chmod');
  assert.match(e.message, `/tmp/weightd-${process.getuid!()}`);
});

test('a directory created for the sockets is removed once empty; one that existed stays', () => {
  const tmp = makeTempDir('created');
  try {
    const made = resolveSocketDir(`${tmp}/new/dir`);
    writeFileSync(`${made}/x.lock`, '');
    removeSocketDirIfCreated(made);
    assert.ok(existsSync(made), 'not while something is left in it');
    rmSync(`${made}/x.lock`);
    removeSocketDirIfCreated(made);
    assert.not.ok(existsSync(made));
    resolveSocketDir(tmp);
    removeSocketDirIfCreated(tmp);
    assert.ok(existsSync(tmp), 'an existing directory is never removed');
  } finally {
    removeDir(tmp);
  }
});

test('a second daemon for the same device fails fast naming the holder; the first keeps serving', async () => {
  const tmp = makeTempDir('second');
  const first = await startDaemon({ model: exampleModel, socketDir: tmp });
  try {
    const socket = socketPathFor(tmp, first.devices[0]!);
    const ino = statSync(socket).ino;
    const r = await expectDaemonFailure({ model: exampleModel, socketDir: tmp, devices: first.devices });
    assert.is.not(r.code, 0);
    assert.ok(r.ms < FAST_MS, `failed in ${r.ms} ms`);
    assert.match(r.stderr, `already served by weightd pid ${first.pid}`);
    assert.is(statSync(socket).ino, ino, 'the live socket was not replaced');
    await canAttach(tmp);
  } finally {
    await first.stop();
    removeDir(tmp);
  }
});

test("a SIGKILLed daemon's stale socket and lock are taken over", async () => {
  const tmp = makeTempDir('stale');
  let second: Daemon | undefined;
  try {
    const first = await startDaemon({ model: exampleModel, socketDir: tmp });
    await first.kill9();
    const dev = first.devices[0]!;
    assert.ok(existsSync(socketPathFor(tmp, dev)), 'SIGKILL left the socket behind');
    assert.ok(existsSync(`${tmp}/${dev}.lock`), 'and the lock');
    second = await startDaemon({ model: exampleModel, socketDir: tmp, devices: first.devices });
    const log = second.stderr();
    assert.match(log, /took over the (device )?lock/);
    assert.match(log, String(first.pid), 'the dead holder is named');
    assert.match(log, 'removed a stale socket');
    await canAttach(tmp);
    await second.stop();
    assert.equal(readdirSync(tmp), []);
  } finally {
    await second?.stop();
    removeDir(tmp);
  }
});

test('a SIGKILLed daemon that is still an unreaped zombie does not refuse the restart', async () => {
  const tmp = makeTempDir('zombie');
  const device = `zombie-${process.pid}`;
  const first = await spawnUnreaped([process.execPath, mainJs, '--model', exampleModel, '--device', 'host', '--weight-cache-socket-dir', tmp], { ...process.env, WEIGHTD_HOST_DEVICES: device });
  let second: Daemon | undefined;
  try {
    await first.waitFor(READY_LINE);
    process.kill(first.pid, 'SIGKILL');
    await first.zombie;
    assert.match(readFileSync(`/proc/${first.pid}/stat`, 'latin1'), /\) Z /, 'the killed daemon is a zombie');
    assert.ok(existsSync(`${tmp}/${device}.lock`), 'its lock is still there');
    second = await startDaemon({ model: exampleModel, socketDir: tmp, devices: [device] });
    assert.match(second.stderr(), /took over the (device )?lock/);
    assert.match(second.stderr(), String(first.pid), 'the dead holder is named');
    await canAttach(tmp);
  } finally {
    await second?.stop();
    await first.release();
    removeDir(tmp);
  }
});

test('a socket that still accepts connections is never unlinked, even without a lock', async () => {
  const tmp = makeTempDir('live');
  const dev = `live-${process.pid}`;
  const path = socketPathFor(tmp, dev);
  const squatter = createServer((s) => s.destroy());
  await new Promise<void>((r) => squatter.listen(path, r));
  try {
    const r = await expectDaemonFailure({ model: exampleModel, socketDir: tmp, devices: [dev] });
    assert.match(r.stderr, 'accepts connections although its device lock was free');
    assert.ok(existsSync(path));
    assert.not.ok(existsSync(`${tmp}/${dev}.lock`), 'the lock was let go on failure');
  } finally {
    squatter.close();
    removeDir(tmp);
  }
});

test('a file that is not a socket at the socket path is refused, not replaced', async () => {
  const tmp = makeTempDir('notsock');
  const dev = `file-${process.pid}`;
  try {
    writeFileSync(socketPathFor(tmp, dev), 'precious');
    const r = await expectDaemonFailure({ model: exampleModel, socketDir: tmp, devices: [dev] });
    assert.match(r.stderr, 'exists and is not a socket of this user');
  } finally {
    removeDir(tmp);
  }
});

asRoot(test, 'a client of another uid is refused and logged (SO_PEERCRED)', 'needs a second uid to connect from', async () => {
  const tmp = makeTempDir('peer');
  const daemon = await startDaemon({ model: exampleModel, socketDir: tmp });
  try {
    // Widen what the daemon made private, as a careless operator might: the peer check must
    // still hold.
    chmodSync(tmp, 0o755);
    const socket = socketPathFor(tmp, daemon.devices[0]!);
    chmodSync(socket, 0o666);
    const script = `
      const s = require('net').connect(${JSON.stringify(socket)});
      let got = 0;
      const body = Buffer.from('{"id":1,"cmd":"ping"}');
      const head = Buffer.alloc(10); head.write('WGTD'); head.writeUInt16BE(1, 4); head.writeUInt32BE(body.length, 6);
      s.on('connect', () => s.write(Buffer.concat([head, body])));
      s.on('data', (d) => (got += d.length));
      s.on('close', () => { console.log(JSON.stringify({ got })); });
      s.on('error', () => {});`;
    const out = await new Promise<string>((resolve) => {
      const c = spawn(process.execPath, ['-e', script], { uid: 65534, gid: 65534, stdio: ['ignore', 'pipe', 'inherit'] });
      let text = '';
      c.stdout.on('data', (d: Buffer) => (text += d.toString()));
      c.on('close', () => resolve(text)); // not 'exit': its line may still be in the pipe
    });
    assert.equal(JSON.parse(out), { got: 0 }, 'closed without a reply');
    // The line is written before the close the client saw, but may still be in the pipe.
    await daemon.waitForStderr('the refusal in the log', (text) => text.includes('refused a client of another user'));
    const client = await WeightdClient.connect(socket);
    assert.is((await client.stats()).refusedPeers, 1);
    client.close();
  } finally {
    await daemon.stop();
    removeDir(tmp);
  }
});

test.run();
