// Models served beside the node's own are kept too (issue 17), end to end on the host backend: a
// daemon started with two --model flags and --keeper spawn keeps both models' shards; the next
// daemon with the same flags adopts both without reading either checkpoint and serves the same
// bytes; one started without the second model drops that model's shard at start (nothing will
// adopt it: its memory is not held until the keeper's adoption window ends); and unloading a
// model drops its shard.
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint } from '../../src/client/index.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import type { ModelStatus } from '../../src/nodeStatus.js';
import { startDaemon, type Daemon, type DaemonOptions } from '../helpers/daemon.js';
import { killKeeper, waitUntil as until } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { assertServes, checkpointBytes, readChars } from '../helpers/servedCheckpoint.js';

/** A node of one host device with a keeper, serving the example model and, with `draft`, a variant of it beside. */
function setup(): { opts: (withDraft: boolean) => DaemonOptions; keeper: KeeperClient; socketDir: string; draft: string } {
  const socketDir = join(freshSocketDir(), 's');
  const draft = writeVariant(exampleModel, join(freshTempDir(), 'draft'));
  const devices = [`keepm${process.pid}-${Math.random().toString(36).slice(2, 8)}-0`];
  const keeperArgs = ['--keeper', 'spawn', '--adopt-within', '30', '--log-level', 'debug'];
  return {
    socketDir,
    draft,
    keeper: new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME)),
    opts: (withDraft) => ({ model: exampleModel, tp: 1, socketDir, devices, extraArgs: [...(withDraft ? ['--model', draft] : []), ...keeperArgs] }),
  };
}

/** The keeper's records, as fingerprints sorted. */
async function keptFingerprints(keeper: KeeperClient): Promise<string[]> {
  return (await keeper.list().catch(() => [])).map((r) => r.fingerprint).sort();
}

async function rankFingerprint(dir: string): Promise<string> {
  return (await expectedFingerprint(dir, 1, 0)).fingerprint;
}

async function models(socketDir: string): Promise<ModelStatus[]> {
  const list = await runCli(['ctl', '--weight-cache-socket-dir', socketDir, 'list', '--json'], { timeoutMs: 60_000 });
  assert.is(list.code, 0, list.stderr);
  return (JSON.parse(list.stdout) as { models: ModelStatus[] }).models;
}

test('a model beside the own one survives a restart: both adopt from the keeper, without reading either checkpoint, and serve the same bytes', async () => {
  const { opts, keeper, socketDir, draft } = setup();
  const both = [await rankFingerprint(exampleModel), await rankFingerprint(draft)].sort();
  let daemon: Daemon | undefined;
  try {
    daemon = await startDaemon(opts(true));
    await until('the keeper holds both models', async () => (await keptFingerprints(keeper)).join() === both.join());
    await until('status shows both kept', async () => (await models(socketDir)).every((m) => m.ranks.every((r) => r.kept === true)));
    await assertServes(socketDir, draft);
    const loadedChars = readChars(daemon.pid);
    assert.is((await daemon.stop()).code, 0);
    assert.equal(await keptFingerprints(keeper), both, 'a clean stop keeps both');

    daemon = await startDaemon(opts(true));
    const adoptedChars = readChars(daemon.pid);
    const read = checkpointBytes(exampleModel) + checkpointBytes(draft);
    assert.ok(loadedChars - adoptedChars > 0.9 * read, `loading read ${loadedChars} chars, adopting ${adoptedChars}: the difference is the checkpoints' ${read}`);
    const status = await models(socketDir);
    assert.equal(status.map((m) => [m.name, m.state, m.ranks.map((r) => r.source?.from)]), [
      ['tiny-llama', 'serving', ['keeper']],
      ['draft', 'serving', ['keeper']],
    ]);
    await assertServes(socketDir, exampleModel);
    await assertServes(socketDir, draft);
    await until('the adopted ranks are kept', async () => (await models(socketDir)).every((m) => m.ranks.every((r) => r.kept === true)));

    // Unloading frees the model's memory, the keeper's copy included.
    const unload = await runCli(['ctl', '--weight-cache-socket-dir', socketDir, 'unload', 'draft', '--force'], { timeoutMs: 60_000 });
    assert.is(unload.code, 0, unload.stderr);
    await until("the keeper dropped the unloaded model's shard", async () => (await keptFingerprints(keeper)).join() === (await rankFingerprint(exampleModel)));
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test("a restart without the second model drops that model's kept shard at start and adopts the own one", async () => {
  const { opts, keeper, socketDir, draft } = setup();
  const own = await rankFingerprint(exampleModel);
  let daemon: Daemon | undefined;
  try {
    daemon = await startDaemon(opts(true));
    await until('the keeper holds both models', async () => (await keptFingerprints(keeper)).length === 2);
    await daemon.stop();

    daemon = await startDaemon(opts(false));
    assert.match(daemon.stderr(), /"adoptedRanks":1[,}]/);
    assert.match(daemon.stderr(), new RegExp(`"fingerprint":"${await rankFingerprint(draft)}".*"msg":"dropped a kept shard that no model of this start plans`));
    assert.equal(await keptFingerprints(keeper), [own], "only the own model's shard is kept");
    assert.equal((await models(socketDir)).map((m) => m.name), ['tiny-llama']);
    await assertServes(socketDir, exampleModel);
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test.run();
