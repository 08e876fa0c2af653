// The cache survives the daemon (issue 14), end to end on the host backend: a daemon with
// --keeper spawn is killed (-9) or stopped, and the next one adopts the kept shards without
// reading the checkpoint; the keeper's own death, both deaths, a corrupt or foreign record and
// a client that maps a segment the keeper has freed each behave as docs/operations.md says.
// Every test kills the keeper it made, and checks that no weightd file appears in /dev/shm.
import { spawn } from 'node:child_process';
import { closeSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket } from '../../src/client/index.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_LOG_NAME, KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { startDaemon, type Daemon, type DaemonOptions } from '../helpers/daemon.js';
import { keeperPid, killKeeper, processAlive as alive, waitUntil as until } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir, repoRoot } from '../helpers/paths.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { printedLines, PYTHON, runClient, startHolder } from '../client/runClient.js';

interface HashesReply {
  tensors: Record<string, { sha256: string }>;
}

/** A node's setup that a second daemon can restart: same devices, same socket dir, same keeper. */
function setup(tp = 1, adoptWithinS = 30): { opts: DaemonOptions; keeper: KeeperClient; socketDir: string } {
  const socketDir = join(freshSocketDir(), 's');
  const devices = Array.from({ length: tp }, (_, i) => `keep${process.pid}-${Math.random().toString(36).slice(2, 8)}-${i}`);
  return {
    socketDir,
    keeper: new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME)),
    opts: { model: exampleModel, tp, socketDir, devices, extraArgs: ['--keeper', 'spawn', '--adopt-within', String(adoptWithinS), '--log-level', 'debug'] },
  };
}

/** Bytes the process passed through read(2) and friends so far (/proc/PID/io rchar). */
function readChars(pid: number): number {
  return Number(/rchar: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))![1]);
}

function weightdFilesInDevShm(): string[] {
  return readdirSync('/dev/shm').filter((f) => f.startsWith('weightd-') && !f.startsWith('weightd-test-'));
}

/** Every rank's tensors, as a client sees them, equal the checkpoint's slices. */
async function assertServesCheckpoint(socketDir: string, tp: number, lang: 'ts' | 'python' = 'ts'): Promise<void> {
  for (let rank = 0; rank < tp; rank++) {
    const socket = await findSocket({ socketDir, globalRank: rank });
    const got = await runClient<HashesReply>(lang, 'hashes', socket, await expectedFingerprint(exampleModel, tp, rank), 'map');
    const expected = expectedRank(exampleModel, tp, rank);
    assert.equal(Object.keys(got.tensors).sort(), [...expected.keys()].sort());
    for (const [name, e] of expected) assert.is(got.tensors[name]!.sha256, e.sha256, `rank ${rank} ${name}`);
  }
}

/** Waits until the keeper holds `n` records (the ranks' shards). */
async function kept(keeper: KeeperClient, n: number): Promise<void> {
  await until(`the keeper holds ${n} shard(s)`, async () => (await keeper.list().catch(() => [])).length === n);
}

/**
 * Starts the next daemon of a node and checks it adopted every rank (or none) and serves the
 * checkpoint's bytes from the first READY on; then stops it, unless the test wants it running.
 */
async function restart(opts: DaemonOptions, socketDir: string, adopted: boolean, lang: 'ts' | 'python' = 'ts'): Promise<Daemon> {
  const tp = opts.tp ?? 1;
  const next = await startDaemon(opts);
  assert.match(next.stderr(), new RegExp(`"adoptedRanks":${adopted ? tp : 0}[,}]`));
  await assertServesCheckpoint(socketDir, tp, lang);
  return next;
}

test('kill -9 while serving: the next daemon adopts every rank without reading the checkpoint, and serves the same bytes', async () => {
  const { opts, keeper, socketDir } = setup(2);
  try {
    const first = await startDaemon(opts);
    const loadedChars = readChars(first.pid);
    await kept(keeper, 2);
    // The keeper it spawned logs at the daemon's --log-level (debug): its connections show.
    assert.match(readFileSync(join(socketDir, KEEPER_LOG_NAME), 'utf8'), /"level":"debug","msg":"client connected"/);
    assert.equal(weightdFilesInDevShm(), [], 'no named file in /dev/shm while serving');
    await first.kill9();
    const second = await restart(opts, socketDir, true, 'python');
    const adoptedChars = readChars(second.pid);
    const checkpointBytes = readdirSync(exampleModel).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + readFileSync(join(exampleModel, f)).length, 0);
    // The first read every byte of the checkpoint; the second only headers and content samples.
    assert.ok(loadedChars - adoptedChars > 0.9 * checkpointBytes, `loading read ${loadedChars} chars, adopting ${adoptedChars}: the difference is the checkpoint's ${checkpointBytes}`);
    await assertServesCheckpoint(socketDir, 2, 'ts');
    assert.equal(weightdFilesInDevShm(), []);
    await second.stop();
  } finally {
    await killKeeper(keeper);
  }
});

test('a clean stop (SIGTERM, as systemctl restart does) keeps the shards too, and the restart adopts them', async () => {
  const { opts, keeper, socketDir } = setup(1);
  try {
    const first = await startDaemon(opts);
    await kept(keeper, 1);
    assert.equal((await first.stop()).code, 0);
    const records = await keeper.list();
    assert.is(records.length, 1, 'the keeper still holds the shard after the daemon stopped');
    assert.is(records[0]!.ownerAlive, false);
    await (await restart(opts, socketDir, true)).stop();
  } finally {
    await killKeeper(keeper);
  }
});

test('one rank\'s record gone: the restart adopts the other, which leaves the node\'s fill group, and loads this one from the checkpoint, hashing alone', async () => {
  const { opts, keeper, socketDir } = setup(2);
  try {
    const first = await startDaemon(opts);
    await kept(keeper, 2);
    await first.kill9();
    assert.is(await keeper.drop(opts.devices![1]!), 1);
    // Rank 1 fills and waits at its end for the node's other ranks to finish hashing; rank 0
    // adopted, so it must leave the group, or rank 1 (and READY) waits for ever.
    const second = await startDaemon(opts);
    assert.match(second.stderr(), /"adoptedRanks":1[,}]/);
    await assertServesCheckpoint(socketDir, 2);
    await kept(keeper, 2);
    await second.stop();
  } finally {
    await killKeeper(keeper);
  }
});

test('kill -9 while a client holds a mapping: the client keeps reading, and the restart adopts', async () => {
  const { opts, keeper, socketDir } = setup(1);
  try {
    const first = await startDaemon(opts);
    await kept(keeper, 1);
    const socket = await findSocket({ socketDir, globalRank: 0 });
    const holder = await startHolder('python', socket, await expectedFingerprint(exampleModel, 1, 0));
    try {
      await first.kill9();
      const second = await restart(opts, socketDir, true, 'python');
      assert.ok(holder.child.exitCode === null, 'the client that held a mapping through the crash is still running');
      await second.stop();
    } finally {
      holder.child.kill('SIGKILL');
    }
  } finally {
    await killKeeper(keeper);
  }
});

test('kill -9 while loading: nothing was kept, the restart loads from the checkpoint', async () => {
  const { opts, keeper, socketDir } = setup(1);
  try {
    // Stopped as soon as the load starts, before the rank can be kept.
    const first = await startDaemon({ ...opts, until: /checkpoint planned/ });
    await first.kill9();
    await (await restart(opts, socketDir, false)).stop();
  } finally {
    await killKeeper(keeper);
  }
});

test('kill -9 of the keeper: the daemon keeps serving, starts another keeper and keeps its shard there again', async () => {
  const { opts, keeper, socketDir } = setup(1);
  try {
    const daemon = await startDaemon(opts);
    await kept(keeper, 1);
    const firstKeeper = await keeperPid(keeper);
    await killKeeper(keeper);
    await assertServesCheckpoint(socketDir, 1);
    await kept(keeper, 1);
    assert.is.not(await keeperPid(keeper), firstKeeper);
    await daemon.waitFor(/"msg":"a keeper answers again: the ranks keep their shards there"/);
    assert.match(daemon.stderr(), /"msg":"the keeper ended: every shard stays served/);
    // And that keeper's copy is what a restart adopts.
    await daemon.kill9();
    await (await restart(opts, socketDir, true)).stop();
  } finally {
    await killKeeper(keeper);
  }
});

test('both killed: the memory is gone with them, the restart loads from the checkpoint, no process is left', async () => {
  const { opts, keeper, socketDir } = setup(1);
  try {
    const daemon = await startDaemon(opts);
    await kept(keeper, 1);
    const pid = await keeperPid(keeper);
    process.kill(pid, 'SIGKILL');
    await daemon.kill9();
    await until('keeper gone', () => !alive(pid));
    await (await restart(opts, socketDir, false)).stop();
  } finally {
    await killKeeper(keeper);
  }
});

test('a corrupt or foreign record is refused by name, dropped, and the rank loads from the checkpoint', async () => {
  for (const [what, record, message] of [
    ['not JSON', Buffer.from('\x00\x01garbage'), /not JSON/],
    ['a newer format', Buffer.from(JSON.stringify({ format: 99, writer: 'weightd 9.0.0' })), /format 99 \(written by weightd 9\.0\.0\), and this weightd reads formats 1/],
  ] as const) {
    const { opts, keeper, socketDir } = setup(1);
    try {
      // Started once to learn the device and fingerprint, then stopped and the record replaced.
      const first = await startDaemon(opts);
      await kept(keeper, 1);
      await first.stop();
      const [entry] = await keeper.list();
      // Any descriptor will do as the foreign record's segment: the keeper never looks inside.
      const fd = openSync(join(exampleModel, 'config.json'), 'r');
      await keeper.keep(entry!.device, entry!.fingerprint, record, [fd]);
      closeSync(fd);
      const second = await startDaemon(opts);
      assert.match(second.stderr(), message, what);
      assert.not.match(second.stderr(), /"adoptedRanks":[1-9]/, what);
      await assertServesCheckpoint(socketDir, 1);
      // The refused record was dropped; the rank's own shard is kept in its place.
      await kept(keeper, 1);
      assert.not.equal((await keeper.list())[0]!.record, record);
      await second.stop();
    } finally {
      await killKeeper(keeper);
    }
  }
});

test('a client that maps a segment the keeper has freed keeps reading the same bytes', async () => {
  const { opts, keeper, socketDir } = setup(1, 1);
  try {
    const daemon = await startDaemon(opts);
    await kept(keeper, 1);
    const socket = await findSocket({ socketDir, globalRank: 0 });
    const expected = await expectedFingerprint(exampleModel, 1, 0);
    const holder = spawn(PYTHON, [join(repoRoot, 'test/client/client_script.py'), 'hold_hash', socket, JSON.stringify(expected)], { stdio: ['pipe', 'pipe', 'inherit'] });
    try {
      const printed = printedLines(holder);
      await printed.wait(1, 'it mapped the shard');
      await daemon.kill9();
      // Nobody adopts within the keeper's 1 s: it frees the shard (and, holding nothing, ends).
      await until('the keeper freed the shard', async () => (await keeper.list().catch(() => [])).length === 0);
      holder.stdin.write('hash\n');
      const got = JSON.parse((await printed.wait(2, 'it read its mapping'))[1]!) as HashesReply;
      for (const [name, e] of expectedRank(exampleModel, 1, 0)) assert.is(got.tensors[name]!.sha256, e.sha256, name);
    } finally {
      holder.kill('SIGKILL');
    }
  } finally {
    await killKeeper(keeper);
  }
});

test.run();
