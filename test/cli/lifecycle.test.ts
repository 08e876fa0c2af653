// The README's first command: the CLI starts on the example checkpoint, logs READY once after
// every log line, serves its segments as memfds (no file in /dev/shm), and exits 0 on SIGTERM/SIGINT. Off a terminal every
// stderr line is JSON, READY included, and the operations guide's jq recipe reads it.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { READY_LINE } from '../helpers/daemon.js';
import { devShmFilesOf, weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir, mainJs, repoRoot } from '../helpers/paths.js';


async function runUntilReadyThenSignal(signal: NodeJS.Signals, extra: string[] = []) {
  const socketDir = freshSocketDir();
  const child = spawn(process.execPath, [mainJs, '--model', exampleModel, '--weight-cache-socket-dir', socketDir, ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let signalled = false;
  // What the daemon holds while it serves, read from /proc at READY.
  let atReady: { memfds: string[]; devShm: string[]; devShmListing: string[] } | undefined;
  const closed = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  child.stderr.on('data', (d) => {
    stderr += d;
    if (!signalled && READY_LINE.test(stderr)) {
      signalled = true;
      atReady = { memfds: weightdMemfds(child.pid!), devShm: devShmFilesOf(child.pid!), devShmListing: readdirSync('/dev/shm') };
      child.kill(signal);
    }
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  const code = await closed;
  clearTimeout(timer);
  assert.equal(readdirSync(socketDir), [], 'no socket, lock or node.json left');
  rmSync(socketDir, { recursive: true, force: true });
  return { code, stderr, atReady: atReady! };
}

type Line = { msg: string; nodeRank?: number; ready?: boolean; state?: string };

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  test(`starts on the example, READY once, ${signal} exits 0 and cleans up`, async () => {
    const { code, stderr, atReady } = await runUntilReadyThenSignal(signal, ['-tp', '2', '--device', 'host']);
    const lines = stderr.trim().split('\n').map((l) => JSON.parse(l) as Line);
    const readyAt = lines.findIndex((l) => l.msg.startsWith('READY'));
    assert.is(lines.filter((l) => l.msg.startsWith('READY')).length, 1, 'READY logged once');
    assert.match(lines[readyAt]!.msg, /^READY node 0\/1 local_ranks=2 tp=2 model=/);
    assert.is(lines[readyAt]!.ready, true);
    assert.ok(lines.slice(0, readyAt).some((l) => l.msg === 'checkpoint planned'), 'log lines came before READY');
    // Each rank says how long making its segments took, apart from the fill.
    const allocated = lines.slice(0, readyAt).filter((l) => /^rank \d allocated .* in \d+ ms \(\d+ segments?\)$/.test(l.msg)) as Array<Line & { allocateMs?: number }>;
    assert.is(allocated.length, 2, 'one allocated line per rank');
    for (const l of allocated) assert.ok(Number.isInteger(l.allocateMs), l.msg);
    for (const l of lines.slice(readyAt + 1)) assert.ok(!(['checkpoint planned', 'supervisor state'].includes(l.msg) && ['loading', 'ready'].includes(l.state ?? '')), `no loading line after READY: ${l.msg}`);
    assert.ok(lines.slice(readyAt + 1).some((l) => l.msg === 'stopping'), 'the stop is logged after READY');
    assert.is(code, 0, stderr);
    // While serving: one sealed memfd per rank, and nothing in /dev/shm open or mapped by the
    // daemon, whatever other processes keep there (the listing is shown when this fails).
    assert.equal(atReady.memfds.map((t) => t.replace(/^\/memfd:weightd:.*:(s\d+) \(deleted\)$/, '$1')), ['s0', 's0'], 'one memfd segment per rank');
    assert.equal(atReady.devShm, [], `the daemon holds no /dev/shm file (/dev/shm: ${atReady.devShmListing.join(', ')})`);
  });
}

test('every stderr line is JSON carrying the node rank (no TTY), READY grep-able', async () => {
  const { stderr } = await runUntilReadyThenSignal('SIGTERM');
  const lines = stderr.trim().split('\n');
  for (const l of lines) assert.is((JSON.parse(l) as Line).nodeRank, 0, l);
  assert.is(lines.filter((l) => /READY/.test(l)).length, 1, 'grep READY finds the one line');
  // Each line says when, since the process started, it was written: in order, READY after the load.
  const since = lines.map((l) => (JSON.parse(l) as { sinceStartMs: number }).sinceStartMs);
  assert.ok(since.every((t, i) => Number.isInteger(t) && t > 0 && (i === 0 || t >= since[i - 1]!)), since.join(' '));
});

test('READY is written at any --log-level: it is the readiness signal, not chatter', async () => {
  const { stderr } = await runUntilReadyThenSignal('SIGTERM', ['--log-level', 'warn']);
  const lines = stderr.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Line);
  assert.is(lines.filter((l) => l.ready === true).length, 1, stderr);
  assert.ok(!lines.some((l) => l.msg === 'checkpoint planned'), 'info lines stay suppressed');
});

test("docs/operations.md's jq recipes read the log as written", async () => {
  const doc = readFileSync(`${repoRoot}docs/operations.md`, 'utf8');
  const recipes = [...doc.matchAll(/`journalctl -u weightd -o cat \| (jq [^`]*)`/g)].map((m) => m[1]!);
  assert.ok(recipes.length >= 2, 'the guide has jq recipes over journalctl -o cat');
  // A daemon that warns (a non-loopback inspect address) and then stops.
  const { stderr } = await runUntilReadyThenSignal('SIGTERM', ['--inspect-port', '0', '--inspect-host', '0.0.0.0']);
  for (const recipe of recipes) {
    // journalctl -o cat prints each line as the process wrote it: the captured stderr is that.
    const r = spawnSync('sh', ['-c', recipe], { input: stderr, encoding: 'utf8' });
    assert.is(r.status, 0, `${recipe} failed: ${r.stderr}`);
    assert.ok(r.stdout.trim().length > 0, `${recipe} printed something`);
  }
});

test('a socket path the kernel would refuse fails at start-up, before any load, and leaves no directory', () => {
  const parent = freshSocketDir();
  const socketDir = join(parent, 'd'.repeat(100));
  const r = spawnSync(process.execPath, [mainJs, '--model', exampleModel, '--weight-cache-socket-dir', socketDir], { encoding: 'utf8', timeout: 60_000 });
  const lines = r.stderr.trim().split('\n').map((l) => JSON.parse(l) as Line & { code?: string });
  const leftDir = existsSync(socketDir);
  rmSync(parent, { recursive: true, force: true });
  assert.not.ok(leftDir, 'the socket directory it created is removed again');
  assert.is(r.status, 1, r.stderr);
  const failure = lines.find((l) => l.code === 'E_SOCKET_PATH_TOO_LONG');
  assert.ok(failure, r.stderr);
  assert.match(failure!.msg, /Pass a shorter --weight-cache-socket-dir/);
  assert.not.ok(lines.some((l) => /loaded/.test(l.msg)), 'nothing was loaded first');
  assert.is(lines.filter((l) => /READY/.test(l.msg)).length, 0);
});

test('a usage error is a JSON line too off a terminal', async () => {
  const r = spawnSync(process.execPath, [mainJs, '--bogus'], { encoding: 'utf8' });
  assert.is(r.status, 2);
  const line = JSON.parse(r.stderr.trim()) as Line & { code: string };
  assert.is(line.code, 'E_USAGE');
  assert.match(line.msg, /unknown option '--bogus'/);
});

test.run();
