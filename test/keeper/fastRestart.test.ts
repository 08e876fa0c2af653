// A restart's fast path (issue 33, src/actors/adoptHere.ts): with --keeper on the host backend, a
// rank whose shard the keeper holds, with the same record checks as ever (fingerprint, arena, the
// files' stat identity), adopts it on the main thread: no worker thread starts, /status says
// `adoptedOn: "main"`, and what it serves (ctl list, fingerprints, every byte) is the full load's.
// A checkpoint file touched or replaced while the daemon was down takes the full path: its worker
// starts and loads from the checkpoint.
// The plan comes from the keeper too (src/keeper/keptPlan.ts): a restart whose shards are kept
// reads no safetensors header; a changed file, or a plan record that is corrupt, foreign or
// missing (a weightd before kept plans), plans from the headers, with a debug line saying why.
import { cpSync, renameSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket } from '../../src/client/index.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { startDaemon, type Daemon, type DaemonOptions } from '../helpers/daemon.js';
import { afterCtimeOf } from '../helpers/fileClock.js';
import { killKeeper, waitUntil } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { httpGet } from '../inspect/httpGet.js';
import { runClient } from '../client/runClient.js';
import { runFixture } from '../helpers/runFixture.js';

const WORKER_STARTED = /"msg":"rank \d+: worker thread started/;
/** The plan line of a start that read and checked every safetensors header (the example has 2 files), and of one that read none. */
const PLANNED_FROM_HEADERS = /"from":"headers","headersRead":2,[^\n]*"msg":"checkpoint planned"/;
const PLANNED_FROM_KEEPER = /"from":"keeper","headersRead":0,[^\n]*"msg":"checkpoint planned"/;
const rewriteKeptRecord = fileURLToPath(new URL('./fixtures/rewriteKeptRecord.js', import.meta.url));

/** The debug line of a start that could not take its plan from the keeper, and why. */
function notFromKeeper(stderr: string): string {
  return /"reason":"([^"]*)"[^\n]*"msg":"planning model /.exec(stderr.replace(/\\"/g, "'"))?.[1] ?? `(no such line in:\n${stderr.slice(-3000)})`;
}

/** A copy of the example checkpoint (its files are touched here), a node that can restart on it, and its keeper. */
function setup(): { model: string; opts: DaemonOptions; keeper: KeeperClient; socketDir: string } {
  const model = join(freshTempDir(), 'tiny');
  cpSync(exampleModel, model, { recursive: true });
  const socketDir = join(freshSocketDir(), 's');
  const devices = [`fast${process.pid}-${Math.random().toString(36).slice(2, 8)}-0`];
  return {
    model,
    socketDir,
    keeper: new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME)),
    opts: { model, tp: 1, socketDir, devices, extraArgs: ['--keeper', 'spawn', '--adopt-within', '30', '--inspect-port', '0', '--log-level', 'debug'] },
  };
}

interface Served {
  /** /status's rank 0 as the daemon says it. */
  rank: { source: string; adoptedOn: string | null; notAdopted: string | null };
  /** ctl list --json (models, fingerprints, states, each rank's segments and digests), less VARIES. */
  list: unknown;
  /** Each tensor's sha256 as a client maps it. */
  hashes: Record<string, { sha256: string }>;
}

async function served(d: Daemon, model: string, socketDir: string): Promise<Served> {
  const url = /"url":"(http:\/\/[^"]+)"/.exec(d.stderr())![1]!;
  const status = JSON.parse((await httpGet(`${url}/status`)).body) as { ranks: Served['rank'][] };
  const ctl = await runCli(['ctl', '--weight-cache-socket-dir', socketDir, 'list', '--json'], { timeoutMs: 60_000 });
  assert.is(ctl.code, 0, ctl.stderr);
  const socket = await findSocket({ socketDir, globalRank: 0 });
  const { tensors: hashes } = await runClient<{ tensors: Served['hashes'] }>('ts', 'hashes', socket, await expectedFingerprint(model, 1, 0), 'map');
  return { rank: status.ranks[0]!, list: JSON.parse(ctl.stdout, (key, value: unknown) => (VARIES.has(key) ? undefined : value)), hashes };
}

/** What ctl list says that differs between any two starts (times, free memory, descriptor numbers) or says how the rank was loaded. */
const VARIES = new Set(['lastUsedAt', 'servingSince', 'seconds', 'freeBytes', 'fd', 'source']);

function assertCheckpointBytes(model: string, hashes: Served['hashes']): void {
  const expected = expectedRank(model, 1, 0);
  assert.equal(Object.keys(hashes).sort(), [...expected.keys()].sort());
  for (const [name, e] of expected) assert.is(hashes[name]!.sha256, e.sha256, name);
}

/** Loads the checkpoint once (the full path), leaves its shard with the keeper (stopped, or killed), and returns what it served. */
async function loadOnce(s: ReturnType<typeof setup>, end: 'stop' | 'kill9'): Promise<Served> {
  const first = await startDaemon(s.opts);
  assert.match(first.stderr(), WORKER_STARTED, 'a load from the checkpoint runs on a worker thread');
  assert.match(first.stderr(), PLANNED_FROM_HEADERS, 'a first start plans from the headers');
  assert.match(notFromKeeper(first.stderr()), /^no record of device \S+ carries a plan for these options$/);
  await waitUntil('the keeper holds the shard', async () => (await s.keeper.list().catch(() => [])).length === 1);
  const full = await served(first, s.model, s.socketDir);
  assert.is(full.rank.source, 'checkpoint');
  assertCheckpointBytes(s.model, full.hashes);
  if (end === 'stop') assert.is((await first.stop()).code, 0);
  else await first.kill9();
  return full;
}

for (const end of ['stop', 'kill9'] as const) {
  test(`after a ${end === 'stop' ? 'clean stop' : 'kill -9'}, the restart adopts on the main thread (no worker thread) and serves what the full load served`, async () => {
    const s = setup();
    try {
      const full = await loadOnce(s, end);
      const second = await startDaemon(s.opts);
      try {
        assert.match(second.stderr(), /"adoptedRanks":1[,}]/);
        assert.not.match(second.stderr(), WORKER_STARTED, 'no worker thread starts on the fast path');
        assert.match(second.stderr(), /"source":"keeper","adoptedOn":"main"/);
        assert.match(second.stderr(), PLANNED_FROM_KEEPER, 'planned from the kept record');
        assert.not.match(second.stderr(), /"from":"headers"/, 'no safetensors header read');
        const fast = await served(second, s.model, s.socketDir);
        assert.is(fast.rank.source, 'keeper');
        assert.is(fast.rank.adoptedOn, 'main');
        assert.equal(fast.list, full.list, 'ctl list (names, fingerprints, states) as after the full load');
        assert.equal(fast.hashes, full.hashes, 'every tensor\'s bytes as after the full load');
      } finally {
        await second.stop();
      }
    } finally {
      await killKeeper(s.keeper);
    }
  });
}

const changes: Array<[string, (file: string) => void]> = [
  ['touched', (file) => utimesSync(file, new Date(), new Date(Date.now() + 5_000))],
  [
    'replaced by a copy (a new inode, the same bytes)',
    (file) => {
      cpSync(file, `${file}.new`);
      renameSync(`${file}.new`, file);
    },
  ],
];
for (const [what, change] of changes) {
  test(`a checkpoint file ${what} while the daemon was down: the restart takes the full path (its worker loads from the checkpoint)`, async () => {
    const s = setup();
    try {
      await loadOnce(s, 'stop');
      const file = join(s.model, 'model-00002-of-00002.safetensors');
      afterCtimeOf(file);
      change(file);
      const second = await startDaemon(s.opts);
      try {
        assert.match(second.stderr(), /"adoptedRanks":0[,}]/);
        assert.match(second.stderr(), WORKER_STARTED);
        assert.match(second.stderr(), PLANNED_FROM_HEADERS);
        assert.match(notFromKeeper(second.stderr()), /^files the plan was made from changed since it was kept \(.*model-00002-of-00002\.safetensors: (mtime|inode) /);
        const got = await served(second, s.model, s.socketDir);
        assert.is(got.rank.source, 'checkpoint');
        assert.is(got.rank.adoptedOn, null);
        assert.match(got.rank.notAdopted ?? '', /the checkpoint files changed since the shard was kept \(model-00002-of-00002\.safetensors: /);
        assertCheckpointBytes(s.model, got.hashes);
      } finally {
        await second.stop();
      }
    } finally {
      await killKeeper(s.keeper);
    }
  });
}

const edits: Array<[edit: string, what: string, why: RegExp]> = [
  ['corrupt', 'whose packed bytes are corrupt', /it is corrupt$/],
  ['foreign', 'made for other options', /^no record of device \S+ carries a plan for these options: a plan kept for other options \(tpSize differ\)$/],
  ['format', 'of a format this weightd does not read', /^the kept plan is in format 99, and this weightd reads 1$/],
  ['none', 'absent (a weightd before kept plans wrote the record)', /^no record of device \S+ carries a plan for these options$/],
];
for (const [edit, what, why] of edits) {
  test(`a kept plan ${what}: the restart plans from the headers, saying why, still adopts the shard, and keeps this start's plan for the next`, async () => {
    const s = setup();
    try {
      const full = await loadOnce(s, 'stop');
      const [kept] = await s.keeper.list();
      const rewritten = await runFixture(rewriteKeptRecord, [s.keeper.socketPath, kept!.device, kept!.fingerprint, edit]);
      assert.is(rewritten.code, 0);
      const keptAt = async () => (JSON.parse((await s.keeper.list())[0]!.record.toString('utf8')) as { keptAt: string }).keptAt;
      const rewrittenAt = await keptAt();
      const second = await startDaemon(s.opts);
      try {
        assert.match(second.stderr(), PLANNED_FROM_HEADERS);
        assert.match(notFromKeeper(second.stderr()), why);
        assert.match(second.stderr(), /"adoptedRanks":1[,}]/, 'the shard is adopted: its own checks pass');
        const got = await served(second, s.model, s.socketDir);
        assert.equal(got.hashes, full.hashes);
        await waitUntil('the adopting rank kept its record again, with its plan', async () => (await keptAt()) !== rewrittenAt);
      } finally {
        await second.stop();
      }
      const third = await startDaemon(s.opts);
      try {
        assert.match(third.stderr(), PLANNED_FROM_KEEPER, 'the restart kept its plan with the shard again');
        assert.match(third.stderr(), /"adoptedRanks":1[,}]/);
      } finally {
        await third.stop();
      }
    } finally {
      await killKeeper(s.keeper);
    }
  });
}

test.run();
