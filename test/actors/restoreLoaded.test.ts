// Which stored load requests a start restores (src/actors/restoreLoaded.ts), against a real keeper
// holding records whose owner has gone: in a group, a model of this node alone is restored and
// one that spans the group is refused by name; a record of another device, or of a live owner,
// is not this start's; a command-line model of the same checkpoint wins under another name.
import { closeSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { RankPlan } from '../../src/checkpoint/types.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { encodeKeptRecord, keptRecordFor, type KeptLoad } from '../../src/keeper/keptRecord.js';
import { restoreLoaded } from '../../src/actors/restoreLoaded.js';
import { hostDevices } from '../../src/native/devices.js';
import { resolveNodeOptions, type NodeConfig } from '../../src/nodeOptions.js';
import { memfdWith, startTestKeeper, type TestKeeper } from '../helpers/keeper.js';
import { exampleModel } from '../helpers/paths.js';
import { runFixture } from '../helpers/runFixture.js';

const keepAndExit = fileURLToPath(new URL('../keeper/fixtures/keepAndExit.js', import.meta.url));
const device = hostDevices(1)[0]!.uuid;

/** Keeps, from a process that then exits, a record of `device` carrying `load`. */
async function keepLoaded(keeper: TestKeeper, load: KeptLoad, rankFingerprint: string, on = device): Promise<void> {
  const plan = { tpRank: 0, tpSize: load.tpSize, files: [], segments: [4096], ops: [], zeroRanges: [], totalBytes: 4096, fingerprint: rankFingerprint } as unknown as RankPlan;
  const record = keptRecordFor({ backend: 'host', handleType: 'memfd', device: on, plan, files: [] }, load.modelDir, 'weightd test', load);
  const memfd = await memfdWith(Buffer.alloc(16));
  try {
    process.env.WEIGHTD_TEST_RECORD = encodeKeptRecord(record).toString('utf8');
    const end = await runFixture(keepAndExit, [keeper.socket, on, `/proc/${process.pid}/fd/${memfd}`, rankFingerprint]);
    assert.is(end.code, 0);
  } finally {
    delete process.env.WEIGHTD_TEST_RECORD;
    closeSync(memfd);
  }
}

function capture(): { log: pino.Logger; lines: () => Array<{ msg: string; [k: string]: unknown }> } {
  const out: string[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void out.push(s) });
  return { log, lines: () => out.map((s) => JSON.parse(s) as { msg: string }) };
}

const groupNode = (): Promise<NodeConfig> =>
  resolveNodeOptions({ model: exampleModel, tensorParallelSize: 2, nnodes: 2, nodeRank: 0, weightCacheMasterPort: 29555, device: 'host', keeper: { mode: 'external' } });

test('in a group, a restored model of this node alone is planned again; one that spans the group is refused by name and why', async () => {
  const keeper = await startTestKeeper();
  try {
    const config = await groupNode();
    const fingerprint = (await planCheckpoint(exampleModel, { tpSize: 1, layouts: [] })).fingerprint;
    const spanning = (await planCheckpoint(exampleModel, { tpSize: 2, layouts: [] })).fingerprint;
    await keepLoaded(keeper, { name: 'local', modelDir: exampleModel, tpSize: 1, layouts: [], fingerprint }, 'rank-local');
    await keepLoaded(keeper, { name: 'wide', modelDir: exampleModel, tpSize: 2, layouts: [], fingerprint: spanning }, 'rank-wide');
    const { log, lines } = capture();
    const restored = await restoreLoaded({ kept: { records: await new KeeperClient(keeper.socket).list(), writer: 'weightd test' }, config, devices: [device], started: [{ name: 'own', fingerprint: 'not-these' }], log });
    assert.equal(restored.map((m) => [m.spec.name, m.origin, m.placement.nnodes, m.plan.fingerprint]), [['local', 'restore', 1, fingerprint]]);
    const refusal = lines().find((l) => l.msg.startsWith('not restoring model "wide"'));
    assert.ok(refusal, JSON.stringify(lines()));
    assert.match(refusal.msg, /at tp 2 it spans the group of 2 nodes, and a model across nodes is not restored/);
    assert.is(refusal.model, exampleModel);
  } finally {
    await keeper.kill();
  }
});

test("records of another device, and a stored request a command-line model of the same checkpoint shadows, are not restored", async () => {
  const keeper = await startTestKeeper();
  try {
    const config = await resolveNodeOptions({ model: exampleModel, device: 'host', keeper: { mode: 'external' } });
    const fingerprint = (await planCheckpoint(exampleModel, { tpSize: 1, layouts: [] })).fingerprint;
    await keepLoaded(keeper, { name: 'elsewhere', modelDir: exampleModel, tpSize: 1, layouts: [], fingerprint }, 'rank-a', 'host-another-daemon-0');
    await keepLoaded(keeper, { name: 'twin', modelDir: exampleModel, tpSize: 1, layouts: [], fingerprint }, 'rank-b');
    const { log, lines } = capture();
    const restored = await restoreLoaded({ kept: { records: await new KeeperClient(keeper.socket).list(), writer: 'weightd test' }, config, devices: [device], started: [{ name: 'tiny-llama', fingerprint }], log });
    assert.equal(restored, []);
    assert.ok(!lines().some((l) => l.msg.includes('"elsewhere"')), "another daemon's record is not this start's to judge");
    assert.ok(lines().some((l) => l.msg.includes('model "twin", loaded at run time') && l.msg.includes('serves that checkpoint as "tiny-llama", which wins')), JSON.stringify(lines()));
  } finally {
    await keeper.kill();
  }
});

test.run();
