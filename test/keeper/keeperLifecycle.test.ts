// A keeper the daemon spawns: startKeeper starts one in its own session (or finds the one
// already serving), --exit-when-empty ends it once it holds nothing and nobody is connected,
// and a WATCH connection closes when the keeper dies.
import { closeSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KeeperClient, startKeeper } from '../../src/keeper/keeperClient.js';
import { memfdWith, processAlive as alive, startTestKeeper, waitUntil } from '../helpers/keeper.js';
import { runFixture } from '../helpers/runFixture.js';

const keepAndExit = fileURLToPath(new URL('./fixtures/keepAndExit.js', import.meta.url));

test('--exit-when-empty: exits 0 once its last record has expired and nobody is connected, removing its socket', async () => {
  const keeper = await startTestKeeper(['--exit-when-empty', '--adopt-within', '1']);
  const memfd = await memfdWith(Buffer.from('x'));
  // Unarmed, the keeper exits empty once --adopt-within passes; the owner below is a Node process
  // that may take longer than that to start on a loaded machine. A watch keeps the keeper until
  // the owner has kept its record; closed, only the record holds it.
  const watch = await keeper.client.watch();
  try {
    const end = await runFixture(keepAndExit, [keeper.socket, 'host-0', `/proc/${process.pid}/fd/${memfd}`, 'fp-a']);
    assert.is(end.code, 0);
    watch.destroy();
    assert.equal(await keeper.exited, { code: 0, signal: null });
    assert.not.ok(existsSync(keeper.socket));
    assert.match(keeper.stderr(), /record expired[^]*no record held and no client connected: exiting/);
  } finally {
    watch.destroy();
    closeSync(memfd);
    await keeper.kill();
  }
});

test('SIGHUP and SIGQUIT stop it as SIGTERM does: exit 0, its socket removed (weightd keeper forwards all four)', async () => {
  for (const signal of ['SIGHUP', 'SIGQUIT'] as const) {
    const keeper = await startTestKeeper();
    try {
      process.kill(keeper.pid, signal);
      assert.equal(await keeper.exited, { code: 0, signal: null }, signal);
      assert.not.ok(existsSync(keeper.socket), signal);
      assert.match(keeper.stderr(), /stopping on a signal: every kept record is freed/);
    } finally {
      await keeper.kill();
    }
  }
});

test('--exit-when-empty: a WATCH connection keeps it; closing the watch ends it', async () => {
  const keeper = await startTestKeeper(['--exit-when-empty']);
  try {
    const watch = await keeper.client.watch();
    // It is armed by the WATCH and then waits for the watcher only.
    await keeper.client.ping();
    assert.ok(alive(keeper.pid));
    watch.destroy();
    assert.equal(await keeper.exited, { code: 0, signal: null });
  } finally {
    await keeper.kill();
  }
});

test("a WATCH connection closes when the keeper is killed, and the keeper never writes to it", async () => {
  const keeper = await startTestKeeper();
  try {
    const watch = await keeper.client.watch();
    let received = 0;
    watch.on('data', (d: Buffer) => (received += d.length));
    watch.on('error', () => {});
    const closed = new Promise((resolve) => watch.once('close', resolve));
    await keeper.client.ping();
    process.kill(keeper.pid, 'SIGKILL');
    await closed;
    assert.is(received, 0);
  } finally {
    await keeper.kill();
  }
});

test('startKeeper spawns a detached keeper and answers with its PING; a second call finds it instead of starting another', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  const socket = join(dir, 'keeper.sock');
  let pid = 0;
  try {
    const first = await startKeeper({ socket, stderr: 'ignore' });
    pid = first.ping.pid;
    assert.equal({ spawned: first.spawned, records: first.ping.records, version: first.ping.protocolVersion }, { spawned: true, records: 0, version: 1 });
    // Its own session: a signal to this test's process group does not reach it.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    assert.is(Number(fields[3]), pid, 'the keeper leads its own session');
    const second = await startKeeper({ socket, stderr: 'ignore' });
    assert.equal({ spawned: second.spawned, pid: second.ping.pid }, { spawned: false, pid });
    // Spawned with --exit-when-empty: armed by a WATCH, it ends when the watch closes.
    const watch = await new KeeperClient(socket).watch();
    watch.destroy();
    await waitUntil('the spawned keeper exits', () => !alive(pid));
    pid = 0;
    // The second call's keeper had exited (3) before it answered, so none took the socket over.
    assert.not.ok(existsSync(socket), 'no keeper serves the socket any more');
  } finally {
    if (pid) process.kill(pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test('startKeeper of a keeper that cannot start: E_KEEPER_START naming its exit', async () => {
  const err = await startKeeper({ socket: '/nonexistent-weightd-dir/keeper.sock', stderr: 'ignore' }).then(() => undefined, (e: unknown) => e);
  assert.is((err as { code?: string }).code, 'E_KEEPER_START');
  assert.match((err as Error).message, /exited with code 2 before serving/);
});

test.run();
