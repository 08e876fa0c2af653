// A keeper a daemon spawned outlives it (docs/operations.md, "Restarts and upgrades"): the
// daemon's stop says what it still holds and until when, and `weightd keeper status|stop` find it
// by its socket alone, with the socket directory's flag before or after the subcommand.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_MAGIC, KEEPER_PROTOCOL_VERSION, KeeperOp } from '../../src/keeper/keeperProtocol.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { startDaemon } from '../helpers/daemon.js';
import { keeperPid, killKeeper, processAlive, waitUntil } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

test('the stop log names what the keeper holds and until when; keeper status shows it, keeper stop frees it', async () => {
  const socketDir = join(freshSocketDir(), 's');
  const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
  const daemon = await startDaemon({ model: exampleModel, socketDir, extraArgs: ['--keeper', 'spawn', '--adopt-within', '30'] });
  try {
    await waitUntil('the keeper holds the rank', async () => (await keeper.list().catch(() => [])).length === 1);
    const pid = await keeperPid(keeper);
    const stoppedAt = Date.now();
    assert.is((await daemon.stop()).code, 0);
    const line = daemon
      .stderr()
      .split('\n')
      .map((l) => JSON.parse(l || '{}') as { msg?: string; bytes?: number; freedAt?: string })
      .find((l) => l.msg?.startsWith(`the keeper (pid ${pid}) still holds 1 shard (`));
    assert.ok(line, daemon.stderr());
    assert.match(line!.msg!, /of this daemon until \S+ \(--adopt-within 30 s\), for the next daemon to adopt; weightd keeper stop --socket \S+ frees them now/);
    const until = Date.parse(line!.freedAt!) - stoppedAt;
    assert.ok(until > 25_000 && until <= 31_000 + (Date.now() - stoppedAt), `freed about 30 s after the stop: ${until} ms`);
    assert.ok(line!.bytes! > 0);

    const text = await runCli(['keeper', 'status', '--weight-cache-socket-dir', socketDir]);
    assert.is(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^keeper pid ${pid} at \\S+keeper\\.sock: up \\d+ s, holds 1 shard \\([\\d.]+ [kMG]?B, 1 descriptors\\)\n`));
    assert.match(text.stdout, /tiny-llama rank 0, [\d.]+ [kMG]?B {2}owner gone: freed at \S+ unless a daemon adopts it/);
    const json = await runCli(['--weight-cache-socket-dir', socketDir, 'keeper', 'status', '--json']);
    const status = JSON.parse(json.stdout) as { pid: number; bytes: number; shards: Array<{ model: string; bytes: number; ownerAlive: boolean; freedAt: string }> };
    assert.is(status.pid, pid);
    assert.is(status.shards.length, 1);
    assert.is(status.shards[0]!.model, exampleModel.replace(/\/$/, ''));
    assert.is(status.shards[0]!.bytes, line!.bytes);
    assert.is(status.shards[0]!.ownerAlive, false);

    const stop = await runCli(['keeper', 'stop', '--weight-cache-socket-dir', socketDir]);
    assert.is(stop.code, 0, stop.stderr);
    assert.match(stop.stdout, new RegExp(`^stopped keeper pid ${pid} at \\S+: freed 1 shard \\(`));
    assert.not.ok(processAlive(pid), 'the keeper is gone when keeper stop returns');
    const none = await runCli(['keeper', 'status', '--weight-cache-socket-dir', socketDir]);
    assert.is(none.code, 2);
    assert.match(none.messages, /no keeper answers at \S+keeper\.sock .*; pass --socket or --weight-cache-socket-dir/);
  } finally {
    await daemon.stop();
    await killKeeper(keeper);
  }
});

/** A keeper's reply frame (docs/keeper.md): status 0, then `body`. */
function okReply(body: Buffer): Buffer {
  const header = Buffer.alloc(10);
  KEEPER_MAGIC.copy(header);
  header.writeUInt16BE(KEEPER_PROTOCOL_VERSION, 4);
  header.writeUInt32BE(body.length + 1, 6);
  return Buffer.concat([header, Buffer.of(0), body]);
}

test('keeper stop signals no pid but the socket peer\'s: a server reporting another process\'s pid is refused, that process left alone', async () => {
  const socketDir = freshSocketDir();
  const socket = join(socketDir, 'liar.sock');
  // A process of this user that a trusted report would have it SIGTERM.
  const bystander = spawn('sleep', ['600'], { stdio: 'ignore' });
  const server = createServer((conn) => {
    conn.once('data', (frame: Buffer) => {
      const op = frame[10];
      if (op === KeeperOp.ping) {
        const body = Buffer.alloc(24);
        body.writeUInt32BE(bystander.pid!, 0);
        body.writeUInt32BE(KEEPER_PROTOCOL_VERSION, 4);
        conn.end(okReply(body));
      } else conn.end(okReply(Buffer.alloc(4)));
    });
    conn.on('error', () => {});
  });
  server.listen(socket);
  await once(server, 'listening');
  try {
    const stop = await runCli(['keeper', 'stop', '--socket', socket]);
    assert.is(stop.code, 1, stop.stdout + stop.stderr);
    assert.match(stop.messages, new RegExp(`E_PEER: the process serving \\S+liar\\.sock is pid ${process.pid} of uid \\d+ but reports pid ${bystander.pid}; .*nothing is signalled`));
    assert.ok(processAlive(bystander.pid!), 'the reported process was not signalled');
  } finally {
    bystander.kill('SIGKILL');
    server.close();
  }
});

test.run();
