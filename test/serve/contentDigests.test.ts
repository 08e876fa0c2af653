// The full digests a daemon publishes (get_state with digests, and the keeper's record, which a
// restarted daemon adopts with them) equal an independent computation: Python's xxhash over the
// file bytes, with no code of weightd's (test/vectors/fingerprint/independent_digests.py). tp=2 on
// the host backend, so each rank's fill copies half of the sharded tensors and must still digest
// every tensor whole.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { parseKeptRecord } from '../../src/keeper/keptRecord.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { PYTHON } from '../client/runClient.js';
import { startDaemon } from '../helpers/daemon.js';
import { killKeeper, waitUntil } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir, repoRoot } from '../helpers/paths.js';

function independentDigests(model: string): Record<string, string> {
  const r = spawnSync(PYTHON, [join(repoRoot, 'test/vectors/fingerprint/independent_digests.py'), model], { encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, string>;
}

async function servedDigests(socketDir: string, globalRank: number): Promise<{ fingerprint: string; digests: Record<string, string> } | undefined> {
  const client = await WeightdClient.connect(await findSocket({ socketDir, globalRank }));
  try {
    const reply = await client.contentDigests((await expectedFingerprint(exampleModel, 2, globalRank)).fingerprint);
    if (reply && 'status' in reply) throw new Error(`rank ${globalRank} serves no version of the example model`);
    return reply;
  } finally {
    client.close();
  }
}

test('every rank serves, the keeper keeps, and a restart adopts, the digests Python computes over the files', async () => {
  const expected = independentDigests(exampleModel);
  const names = (await planCheckpoint(exampleModel, { tpSize: 2 })).ranks[0]!.contentTensors.names;
  assert.equal(Object.keys(expected).sort(), [...names].sort(), 'every tensor, tied ones included');
  const socketDir = join(freshSocketDir(), 's');
  const devices = [0, 1].map((i) => `digests${process.pid}-${i}`);
  const start = () => startDaemon({ model: exampleModel, tp: 2, socketDir, devices, extraArgs: ['--keeper', 'spawn', '--adopt-within', '30'] });
  const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
  let daemon = await start();
  try {
    const fingerprints = new Set<string>();
    for (const rank of [0, 1]) {
      const served = await servedDigests(socketDir, rank);
      assert.ok(served, `rank ${rank} has digests`);
      assert.equal(served.digests, expected);
      fingerprints.add(served.fingerprint);
    }
    assert.is(fingerprints.size, 2, 'each rank has its own full fingerprint');
    await waitUntil('the keeper holds both ranks', async () => (await keeper.list().catch(() => [])).length === 2);
    for (const r of await keeper.list()) {
      const parsed = parseKeptRecord(r.record);
      assert.ok('record' in parsed, JSON.stringify(parsed));
      assert.equal(Object.fromEntries(names.map((n, i) => [n, parsed.record.digests![i]])), expected);
    }
    await daemon.stop();
    daemon = await start();
    assert.match(daemon.stderr(), /adopted|"from":"keeper"/);
    for (const rank of [0, 1]) assert.equal((await servedDigests(socketDir, rank))?.digests, expected, `rank ${rank} after adoption`);
  } finally {
    await daemon.stop();
    await killKeeper(keeper).catch(() => {});
  }
});

test('an old client (sampled version 2) and a new one (full version 3) both attach to a new daemon; a full fingerprint of other bytes is a mismatch naming content', async () => {
  const socketDir = join(freshSocketDir(), 's');
  const daemon = await startDaemon({ model: exampleModel, tp: 1, socketDir, devices: [`versions${process.pid}-0`] });
  const client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
  try {
    const sampled = await expectedFingerprint(exampleModel, 1, 0);
    const full = await expectedFingerprint(exampleModel, 1, 0, undefined, 'checkpoint', true);
    assert.is.not(full.fingerprint, sampled.fingerprint);
    for (const expected of [sampled, full]) {
      const attached = await client.attach(expected);
      assert.is(attached.status, 'attached', JSON.stringify(expected));
      if (attached.status === 'attached') await attached.detach();
    }
    const otherBytes = { fingerprint: 'f'.repeat(64), fingerprintFields: { ...full.fingerprintFields!, content: 'e'.repeat(64) } };
    const refused = await client.attach(otherBytes);
    assert.is(refused.status, 'mismatch');
    if (refused.status === 'mismatch') assert.equal(refused.fields, ['content'], 'compared with the daemon\'s version 3 fields');
  } finally {
    client.close();
    await daemon.stop();
  }
});

test.run();
