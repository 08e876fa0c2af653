// The keeper and a checkpoint that changed (issue 29), on the model: one 48 MiB tensor,
// one byte changed outside the fingerprint's content sample. Changed while the daemon was down:
// the restart does not adopt the kept shard (its record's file identity differs), says which file
// and how in the log and /status, and serves the file's bytes. Changed while it serves: the stale
// version's kept copy is dropped and the reloaded one kept, so the next restart adopts the new bytes.
import { mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient, type Expected } from '../../src/client/index.js';
import { errorCode } from '../../src/errors.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon, type DaemonOptions } from '../helpers/daemon.js';
import { afterCtimeOf } from '../helpers/fileClock.js';
import { killKeeper, waitUntil } from '../helpers/keeper.js';
import { flipUnsampledByte, tensorBytes, TENSOR, writeSingleTensorModel, type SingleTensorModel } from '../helpers/singleTensorModel.js';
import { httpGet } from '../inspect/httpGet.js';

async function setup(): Promise<{ dir: string; m: SingleTensorModel; opts: DaemonOptions; keeper: KeeperClient; socketDir: string }> {
  const dir = makeTempDir('stale-kept');
  mkdirSync(join(dir, 'one48'));
  const m = await writeSingleTensorModel(join(dir, 'one48'));
  const socketDir = join(dir, 's');
  const devices = [`stale${process.pid}-${Math.random().toString(36).slice(2, 8)}-0`];
  return {
    dir,
    m,
    socketDir,
    keeper: new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME)),
    opts: { model: m.dir, tp: 1, socketDir, devices, extraArgs: ['--keeper', 'spawn', '--adopt-within', '30', '--inspect-port', '0'] },
  };
}

/** What a new attach maps: the tensor's bytes, or the refusal's code. */
async function attachBytes(socketDir: string, expected: Expected): Promise<Buffer | string> {
  const client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
  try {
    const attached = await client.attach(expected);
    if (attached.status !== 'attached' || attached.backend !== 'host') return attached.status;
    const { data } = attached.tensors[TENSOR]!;
    const copy = Buffer.from(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
    await attached.detach();
    return copy;
  } catch (err) {
    return errorCode(err) ?? String(err);
  } finally {
    client.close();
  }
}

/** The identity fields of the keeper's only record, and the file's now. */
async function keptIdentity(keeper: KeeperClient, file: string): Promise<{ kept: string | undefined; now: string }> {
  const records = await keeper.list().catch(() => []);
  const files = records.length === 1 ? (JSON.parse(records[0]!.record.toString('utf8')) as { files?: Array<{ ino: string; ctimeNs: string }> }).files : undefined;
  const st = statSync(file, { bigint: true });
  return { kept: files && `${files[0]!.ino}/${files[0]!.ctimeNs}`, now: `${st.ino}/${st.ctimeNs}` };
}

test('changed while the daemon was down: the restart does not adopt, names the file and how (log, /status), and serves the file\'s bytes', async () => {
  const { dir, m, opts, keeper, socketDir } = await setup();
  try {
    const first = await startDaemon(opts);
    await waitUntil('the keeper holds the shard', async () => (await keeper.list().catch(() => [])).length === 1);
    assert.is((await first.stop()).code, 0);
    const expected = await expectedFingerprint(m.dir, 1, 0);
    afterCtimeOf(m.file);
    flipUnsampledByte(m);
    assert.equal(await expectedFingerprint(m.dir, 1, 0), expected, 'outside the sample: the fingerprint is the same');

    const second = await startDaemon(opts);
    try {
      const log = second.stderr();
      assert.match(log, /"adoptedRanks":0[,}]/);
      assert.match(log, /refused the kept shard: the checkpoint files changed since the shard was kept \(model\.safetensors: (mtime|ctime) \d+ -> \d+ \((modified|written)\)\); dropped it, loading from the checkpoint/);
      const url = /"url":"(http:\/\/[^"]+)"/.exec(log)![1]!;
      const status = JSON.parse((await httpGet(`${url}/status`)).body);
      assert.is(status.ranks[0].source, 'checkpoint');
      assert.match(status.ranks[0].notAdopted, /model\.safetensors: (mtime|ctime) \d+ -> \d+/);
      const got = await attachBytes(socketDir, expected);
      assert.ok(Buffer.isBuffer(got) && got.equals(tensorBytes(m)), 'a client maps the file\'s bytes as they are now');
    } finally {
      await second.stop();
    }
  } finally {
    await killKeeper(keeper);
    removeDir(dir);
  }
});

test('changed while serving: never the old bytes; the stale copy is dropped from the keeper and the reloaded one kept, which the next restart adopts', async () => {
  const { dir, m, opts, keeper, socketDir } = await setup();
  const strict = { ...opts, env: { WEIGHTD_SERVE_FILES_CHECK_MS: '0' } };
  try {
    const first = await startDaemon(strict);
    await waitUntil('the keeper holds the shard', async () => (await keeper.list().catch(() => [])).length === 1);
    const expected = await expectedFingerprint(m.dir, 1, 0);
    const before = tensorBytes(m);
    afterCtimeOf(m.file);
    flipUnsampledByte(m);
    const after = tensorBytes(m);
    const next = await attachBytes(socketDir, expected);
    assert.ok(next === 'E_STALE' || (Buffer.isBuffer(next) && next.equals(after)), `refused or the new bytes, never the old: ${Buffer.isBuffer(next) ? (next.equals(before) ? 'the old bytes' : 'other bytes') : next}`);
    await first.waitFor(/was loaded again from its changed checkpoint files, and serves/);
    const fresh = await attachBytes(socketDir, expected);
    assert.ok(Buffer.isBuffer(fresh) && fresh.equals(after), 'the reloaded version serves the file\'s bytes');
    // One record left, and it is the reloaded version's: its identity is the file's now.
    await waitUntil('the keeper holds only the reloaded shard, whose identity is the file\'s now', async () => {
      const { kept, now } = await keptIdentity(keeper, m.file);
      return kept === now;
    });
    assert.is((await first.stop()).code, 0);

    const second = await startDaemon(strict);
    try {
      assert.match(second.stderr(), /"adoptedRanks":1[,}]/);
      const adopted = await attachBytes(socketDir, expected);
      assert.ok(Buffer.isBuffer(adopted) && adopted.equals(after), 'the adopted shard is the file\'s bytes');
    } finally {
      await second.stop();
    }
  } finally {
    await killKeeper(keeper);
    removeDir(dir);
  }
});

test.run();
