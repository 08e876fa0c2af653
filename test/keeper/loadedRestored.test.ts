// A model loaded at run time (weightd ctl load) survives the daemon's restart, end to end on the
// host backend with --keeper spawn: its kept record carries the load request, and the next daemon,
// started with only the original --model, restores it from the keeper (adopted, not read, same
// fingerprint, same bytes). One whose directory changed or is gone is dropped with a line saying
// so; an unloaded one is not restored, even when a lease held it as the daemon was killed; a model
// of the command line under its name wins; a restored one that fails fails alone; and one is not
// charged at admission for the memory it adopts.
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { parseKeptRecord, type KeptLoad } from '../../src/keeper/keptRecord.js';
import type { ModelStatus } from '../../src/nodeStatus.js';
import { startDaemon, type Daemon, type DaemonOptions } from '../helpers/daemon.js';
import { fdKinds, keeperPid, killKeeper, waitUntil as until } from '../helpers/keeper.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { assertServes, checkpointBytes, readChars } from '../helpers/servedCheckpoint.js';

const faultyNode = fileURLToPath(new URL('../rendezvous/fixtures/faultyNode.js', import.meta.url));

/** A node of one host device with a keeper, serving the example model; start's `extra` adds flags, `daemon` what else it runs with. */
function setup() {
  const socketDir = join(freshSocketDir(), 's');
  const devices = [`restore${process.pid}-${Math.random().toString(36).slice(2, 8)}-0`];
  const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
  const start = (extra: string[] = [], daemon: Pick<DaemonOptions, 'script' | 'env' | 'until'> = {}) =>
    startDaemon({ model: exampleModel, tp: 1, socketDir, devices, extraArgs: [...extra, '--keeper', 'spawn', '--adopt-within', '30', '--log-level', 'debug'], ...daemon });
  const ctl = async (...args: string[]) => {
    const r = await runCli(['ctl', '--weight-cache-socket-dir', socketDir, ...args], { timeoutMs: 60_000 });
    assert.is(r.code, 0, r.stderr);
    return r.stdout;
  };
  /** Loads a variant of the example model as "draft" into the running daemon, once the keeper holds it with its load request: its directory and rank fingerprint. */
  const loadDraft = async () => {
    const dir = writeVariant(exampleModel, join(freshTempDir(), 'draft'));
    const rank = await rankFingerprint(dir);
    await ctl('load', '--model', dir, '--name', 'draft');
    await until('the keeper holds the loaded model', async () => (await kept(keeper)).some((r) => r.fingerprint === rank && r.load !== undefined));
    return { dir, rank };
  };
  return { socketDir, keeper, start, ctl, loadDraft, models: async () => (JSON.parse(await ctl('list', '--json')) as { models: ModelStatus[] }).models };
}

/** What the keeper holds: each record's rank fingerprint and load request (undefined: a command-line model's). */
async function kept(keeper: KeeperClient): Promise<Array<{ fingerprint: string; load?: KeptLoad }>> {
  return (await keeper.list().catch(() => [])).map((r) => {
    const parsed = parseKeptRecord(r.record);
    assert.ok('record' in parsed, JSON.stringify(parsed));
    return { fingerprint: r.fingerprint, load: parsed.record.load };
  });
}

async function rankFingerprint(dir: string): Promise<string> {
  return (await expectedFingerprint(dir, 1, 0)).fingerprint;
}

/** How many segments (memfds) the keeper holds, of every model. */
async function keptMemfds(keeper: KeeperClient): Promise<number> {
  return fdKinds(await keeperPid(keeper)).memfd;
}

test('a ctl-loaded model survives a crash of the daemon: the next one, with only the original --model, adopts it without reading it and serves the same bytes; once unloaded it is not restored', async () => {
  const { socketDir, keeper, start, ctl, models } = setup();
  const draft = writeVariant(exampleModel, join(freshTempDir(), 'draft'));
  const draftRank = await rankFingerprint(draft);
  let daemon: Daemon | undefined;
  try {
    daemon = await start();
    await ctl('load', '--model', draft, '--name', 'draft');
    const loaded = (await models()).find((m) => m.name === 'draft')!;
    await until('the keeper holds the loaded model with its load request', async () => (await kept(keeper)).some((r) => r.fingerprint === draftRank && r.load !== undefined));
    const record = (await kept(keeper)).find((r) => r.fingerprint === draftRank)!;
    assert.equal(record.load, { name: 'draft', modelDir: draft, tpSize: 1, layouts: [], fingerprint: loaded.fingerprint });
    assert.is((await kept(keeper)).find((r) => r.fingerprint !== draftRank)!.load, undefined, 'the command-line model carries no load request');
    const loadedChars = readChars(daemon.pid);
    await daemon.kill9();

    daemon = await start();
    const adoptedChars = readChars(daemon.pid);
    const read = checkpointBytes(exampleModel) + checkpointBytes(draft);
    assert.ok(loadedChars - adoptedChars > 0.9 * read, `loading read ${loadedChars} chars, restoring ${adoptedChars}: the difference is the checkpoints' ${read}`);
    assert.match(daemon.stderr(), /"adoptedRanks":1[,}]/);
    assert.match(daemon.stderr(), /"msg":"restoring model \\"draft\\", loaded at run time from [^"]*draft: its ranks adopt what the keeper holds"/);
    const status = await models();
    assert.equal(status.map((m) => [m.name, m.state, m.fingerprint, m.ranks.map((r) => r.source?.from)]), [
      ['tiny-llama', 'serving', status[0]!.fingerprint, ['keeper']],
      ['draft', 'serving', loaded.fingerprint, ['keeper']],
    ]);
    await assertServes(socketDir, draft);
    await assertServes(socketDir, exampleModel);

    // Unloading drops it from the keeper, so the next start has nothing to restore.
    await ctl('unload', 'draft');
    await until("the keeper dropped the unloaded model's shard", async () => !(await kept(keeper)).some((r) => r.fingerprint === draftRank));
    await daemon.stop();
    daemon = await start();
    assert.not.match(daemon.stderr(), /restoring model/);
    assert.equal((await models()).map((m) => m.name), ['tiny-llama']);
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test('a ctl-loaded model whose directory changed, or is gone, is not restored: each is named with its directory and why, and its shard is dropped', async () => {
  const { keeper, start, ctl, models } = setup();
  const changed = writeVariant(exampleModel, join(freshTempDir(), 'changed'));
  const gone = writeVariant(exampleModel, join(freshTempDir(), 'gone'), 0x0f);
  let daemon: Daemon | undefined;
  try {
    daemon = await start();
    await ctl('load', '--model', changed, '--name', 'changed');
    await ctl('load', '--model', gone, '--name', 'gone');
    const before = Object.fromEntries((await models()).map((m) => [m.name, m.fingerprint]));
    await until('the keeper holds three models', async () => (await kept(keeper)).length === 3);
    await daemon.stop();

    writeVariant(exampleModel, changed, 0x33);
    rmSync(gone, { recursive: true });
    daemon = await start();
    const log = daemon.stderr();
    assert.match(log, /"msg":"not restoring model \\"changed\\" \(loaded at run time from [^"]*changed\): its checkpoint changed since it was loaded \(fingerprint \w+ then, \w+ now\); its kept shards are dropped/);
    assert.ok(log.includes(before.changed!), 'the line names the fingerprint it had');
    assert.match(log, /"msg":"not restoring model \\"gone\\" \(loaded at run time from [^"]*gone\): its directory [^"]*gone is gone \(ENOENT\); its kept shards are dropped/);
    assert.equal((await models()).map((m) => m.name), ['tiny-llama']);
    assert.equal((await kept(keeper)).map((r) => r.fingerprint), [await rankFingerprint(exampleModel)], "only the own model's shard is kept");
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test('a model on the new command line under the same name wins over the stored request: it is adopted as the command line plans it, and kept as a command-line model', async () => {
  const { keeper, start, ctl, models } = setup();
  const draft = writeVariant(exampleModel, join(freshTempDir(), 'draft'));
  const draftRank = await rankFingerprint(draft);
  let daemon: Daemon | undefined;
  try {
    daemon = await start();
    await ctl('load', '--model', draft);
    await until('the keeper holds the loaded model', async () => (await kept(keeper)).some((r) => r.fingerprint === draftRank && r.load !== undefined));
    await daemon.stop();

    daemon = await start(['--model', draft]);
    assert.match(daemon.stderr(), /"msg":"model \\"draft\\", loaded at run time from [^"]*draft, is not restored from the keeper: this command line serves a model of that name, which wins"/);
    assert.equal((await models()).map((m) => [m.name, m.ranks.map((r) => r.source?.from)]), [
      ['tiny-llama', ['keeper']],
      ['draft', ['keeper']],
    ]);
    // Adopted with another load request than its own (none): kept again without it.
    await until('the keeper holds it as a command-line model', async () => (await kept(keeper)).some((r) => r.fingerprint === draftRank && r.load === undefined));
    await daemon.stop();
    daemon = await start();
    assert.match(daemon.stderr(), new RegExp(`"fingerprint":"${draftRank}".*"msg":"dropped a kept shard that no model of this start plans`));
    assert.equal((await models()).map((m) => m.name), ['tiny-llama']);
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test('a ctl-loaded model unloaded while a lease holds it, then the daemon killed: the keeper let go of it when it began draining, so the next start neither restores it nor holds any of it', async () => {
  const { socketDir, keeper, start, ctl, loadDraft, models } = setup();
  const ownRank = await rankFingerprint(exampleModel);
  let daemon: Daemon | undefined;
  let client: WeightdClient | undefined;
  try {
    daemon = await start();
    await until('the keeper holds the own model', async () => (await kept(keeper)).some((r) => r.fingerprint === ownRank));
    const ownSegments = await keptMemfds(keeper);
    const { dir: draft, rank: draftRank } = await loadDraft();
    assert.ok((await keptMemfds(keeper)) > ownSegments, "the keeper holds the loaded model's segments besides the own model's");

    client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
    const lease = await client.attach(await expectedFingerprint(draft, 1, 0));
    assert.is(lease.status, 'attached');
    await ctl('unload', 'draft');
    assert.equal((await models()).map((m) => [m.name, m.state, m.leases]), [
      ['tiny-llama', 'serving', 0],
      ['draft', 'draining', 1],
    ], 'the lease holds the unloaded model resident');
    await until("the keeper dropped the draining model's shard", async () => !(await kept(keeper)).some((r) => r.fingerprint === draftRank));
    await until("the keeper closed the draining model's segments", async () => (await keptMemfds(keeper)) === ownSegments);
    await daemon.kill9();

    daemon = await start();
    assert.not.match(daemon.stderr(), /restoring model/);
    assert.not.match(daemon.stderr(), /"model":"draft"|model \\"draft\\"/, 'nothing of the unloaded model was left to restore or drop');
    assert.equal((await models()).map((m) => [m.name, m.ranks.map((r) => r.source?.from)]), [['tiny-llama', ['keeper']]]);
    assert.equal((await kept(keeper)).map((r) => r.fingerprint), [ownRank], "only the own model's shard is kept");
    assert.is(await keptMemfds(keeper), ownSegments, "the keeper holds only the own model's segments");
    assert.is(weightdMemfds(daemon.pid).length, ownSegments, "the restarted daemon holds only the own model's segments");
    await assertServes(socketDir, exampleModel);
  } finally {
    client?.close();
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test('a restored model whose checkpoint is rewritten while it is restored fails alone: the node gets ready and serves its command-line model, the error names the model, and the keeper lets go of its shard', async () => {
  const { socketDir, keeper, start, loadDraft, models } = setup();
  let daemon: Daemon | undefined;
  try {
    daemon = await start();
    const { rank: draftRank } = await loadDraft();
    await daemon.stop();

    // The draft's ranks grow its first file once their device is open: after its plan matched
    // the kept fingerprint, before it serves (modelRankWorker's growFile, only for /draft/).
    // The fixture node writes no READY line (dist/main.js does): the supervisor's ready state is the same moment.
    const ready = /"state":"ready","msg":"supervisor state"/;
    daemon = await start([], { script: faultyNode, env: { WEIGHTD_TEST_MODEL_SCENARIO: JSON.stringify({ growFile: true, onlyFiles: '/draft/' }) }, until: ready });
    const log = daemon.stderr();
    assert.match(log, /"msg":"restoring model \\"draft\\", loaded at run time from [^"]*draft: its ranks adopt what the keeper holds"/);
    assert.match(log, /"level":50,.*"code":"E_FILE_CHANGED","model":"draft","msg":"model \\"draft\\"[^"]*: checkpoint files changed while (the model|rank 0) loaded \([^"]*: size \d+ -> \d+ \(resized\)\)/);
    assert.ok(log.indexOf('E_FILE_CHANGED') < log.search(ready), 'the node got ready once the restored model had failed, without it');
    assert.equal((await models()).map((m) => [m.name, m.state, m.ranks.map((r) => r.source?.from)]), [['tiny-llama', 'serving', ['keeper']]]);
    await assertServes(socketDir, exampleModel);
    // Its ranks had taken the kept shard: a model that fails before serving leaves nothing kept.
    await until("the keeper dropped the failed model's shard", async () => !(await kept(keeper)).some((r) => r.fingerprint === draftRank));
    assert.equal((await kept(keeper)).map((r) => r.fingerprint), [await rankFingerprint(exampleModel)]);
    assert.match(daemon.stderr(), new RegExp(`"fingerprint":"${draftRank}","msg":"dropped the kept shard of model \\\\"draft\\\\", which failed"`));
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test('a restored model is not charged at admission for what it adopts: with its device reporting no free memory it is adopted and serves, where a model that would allocate is refused', async () => {
  const { socketDir, keeper, start, loadDraft, models } = setup();
  let daemon: Daemon | undefined;
  try {
    daemon = await start();
    const { dir: draft } = await loadDraft();
    await daemon.stop();

    // Every rank of a model under a /draft/ directory reports 4 KiB free (modelRankWorker's
    // freeBytes): the GPU of a restart, full of the weights the keeper holds.
    const ready = /"state":"ready","msg":"supervisor state"/;
    daemon = await start([], { script: faultyNode, env: { WEIGHTD_TEST_MODEL_SCENARIO: JSON.stringify({ freeBytes: 4096, onlyFiles: '/draft/' }) }, until: ready });
    assert.match(daemon.stderr(), /"msg":"restoring model \\"draft\\", loaded at run time from [^"]*draft: its ranks adopt what the keeper holds"/);
    assert.not.match(daemon.stderr(), /E_DOES_NOT_FIT/);
    assert.equal((await models()).map((m) => [m.name, m.state, m.ranks.map((r) => r.source?.from)]), [
      ['tiny-llama', 'serving', ['keeper']],
      ['draft', 'serving', ['keeper']],
    ]);
    await assertServes(socketDir, draft);

    // The same report for a model with nothing kept: it would allocate, and is refused.
    const other = writeVariant(exampleModel, join(freshTempDir(), 'draft', 'other'), 0x5a);
    const refused = await runCli(['ctl', '--weight-cache-socket-dir', socketDir, 'load', '--model', other, '--name', 'other'], { timeoutMs: 60_000 });
    assert.is(refused.code, 1, refused.stdout);
    assert.match(refused.stderr, /E_DOES_NOT_FIT: model "other" does not fit beside what is resident/);
    assert.equal((await models()).map((m) => m.name), ['tiny-llama', 'draft']);
  } finally {
    await daemon?.stop();
    await killKeeper(keeper);
  }
});

test.run();
