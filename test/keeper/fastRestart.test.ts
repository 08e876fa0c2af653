// A restart's fast path (issue 33, src/actors/adoptHere.ts): with --keeper on the host backend, a
// rank whose shard the keeper holds, with the same record checks as ever (fingerprint, arena, the
// files' stat identity), adopts it on the main thread: no worker thread starts, /status says
// `adoptedOn: "main"`, and what it serves (ctl list, fingerprints, every byte) is the full load's.
// A checkpoint file touched or replaced while the daemon was down takes the full path: its worker
// starts and loads from the checkpoint.
import { cpSync, renameSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
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

const WORKER_STARTED = /"msg":"rank \d+: worker thread started"/;

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

test.run();
