// Which written versions a start restores from the keeper's records (src/actors/restoreWritten.ts):
// each is planned on its model's checkpoint version with the fingerprint its records' fields and
// digests make; a record that does not add up (a digest changed: corrupt), of a written format
// this weightd does not read, or not weightd's at all is refused alone, by name, and never served;
// the version whose records were kept last is the current one.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { rankFingerprint, writtenVersionFingerprint } from '../../src/checkpoint/fingerprint.js';
import { fillPlanOf } from '../../src/checkpoint/types.js';
import type { KeptRecord as ListedRecord } from '../../src/keeper/keeperProtocol.js';
import { keptRecordFor, WRITTEN_FORMAT } from '../../src/keeper/keptRecord.js';
import { restoreWritten } from '../../src/actors/restoreWritten.js';
import { planModel, type PlannedModel } from '../../src/models/planModel.js';
import { resolveModelSpec } from '../../src/models/modelSpecs.js';
import { resolveNodeOptions } from '../../src/nodeOptions.js';
import { exampleModel } from '../helpers/paths.js';

function capture(): { log: pino.Logger; lines: () => Array<{ msg: string; [k: string]: unknown }> } {
  const out: string[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void out.push(s) });
  return { log, lines: () => out.map((s) => JSON.parse(s) as { msg: string }) };
}

async function checkpoint(): Promise<PlannedModel> {
  const config = await resolveNodeOptions({ model: exampleModel, device: 'host' });
  return planModel(resolveModelSpec({ model: exampleModel, name: 'tiny' }), config, pino({ level: 'silent' }));
}

/** The keeper's LIST entry of written version `version` of `base`'s model, kept at `keptAt`; `tamper` edits the record's JSON last. */
function keptVersion(base: PlannedModel, version: number, keptAt: string, tamper: (r: Record<string, unknown>) => void = () => {}): ListedRecord {
  const rank = base.plan.ranks[0]!;
  const digests = rank.tensors.map((_, i) => (version * 1000 + i).toString(16).padStart(32, '0'));
  const { fingerprint, fields } = writtenVersionFingerprint(base.plan.fingerprintFields, [digests]);
  const plan = { ...fillPlanOf(rank), fingerprint: rankFingerprint(fingerprint, 0) };
  const device = base.devices[0]!.uuid;
  const written = { format: WRITTEN_FORMAT, name: 'tiny', version, base: base.plan.fingerprint, fields, digests, shared: [] };
  const record = keptRecordFor({ backend: 'host', handleType: 'memfd', device, plan, files: [] }, exampleModel, 'weightd test', undefined, [], undefined, new Date(keptAt), { written, currentSince: Date.parse(keptAt) }) as unknown as Record<string, unknown>;
  tamper(record);
  return { device, fingerprint: plan.fingerprint, fdCount: 1, ageMs: 0, ownerPid: 0, ownerAlive: false, expiresInMs: 1000, record: Buffer.from(JSON.stringify(record)) };
}

test('written versions are planned on their checkpoint version with their own fingerprints, and the one kept last is current', async () => {
  const base = await checkpoint();
  const { log } = capture();
  const records = [keptVersion(base, 2, '2026-12-05T01:00:00.000Z'), keptVersion(base, 1, '2026-12-05T02:00:00.000Z')];
  const restored = restoreWritten({ records, planned: [base], devices: [base.devices[0]!.uuid], log });
  assert.equal(restored.models.map((m) => [m.spec.name, m.version, m.origin, m.plan.files.length]), [['tiny', 1, 'update', 0], ['tiny', 2, 'update', 0]]);
  assert.is(restored.models[1]!.plan.ranks[0]!.fingerprint, records[0]!.fingerprint);
  assert.equal(restored.models[1]!.written![0]!.digests.length, base.plan.ranks[0]!.tensors.length);
  assert.equal(restored.current, [{ name: 'tiny', version: 1 }], 'version 1 was kept last: a rollback to it');
});

test('a corrupt record, a written format this weightd does not read and bytes that are not a record are each refused alone, by name', async () => {
  const base = await checkpoint();
  const { log, lines } = capture();
  const corrupt = keptVersion(base, 1, '2026-12-05T01:00:00.000Z', (r) => {
    const w = r.written as { digests: string[] };
    w.digests[0] = 'f'.repeat(32);
  });
  const newer = keptVersion(base, 3, '2026-12-05T01:00:00.000Z', (r) => void ((r.written as { format: number }).format = 99));
  const foreign: ListedRecord = { ...keptVersion(base, 4, '2026-12-05T01:00:00.000Z'), fingerprint: 'someone-else', record: Buffer.from('not json') };
  const records = [corrupt, keptVersion(base, 2, '2026-12-05T02:00:00.000Z'), newer, foreign];
  const restored = restoreWritten({ records, planned: [base], devices: [base.devices[0]!.uuid], log });
  assert.equal(restored.models.map((m) => m.version), [2], 'the sound version is restored, the others are not');
  const warned = lines().filter((l) => l.level === 40).map((l) => l.msg);
  assert.ok(warned.some((m) => m.startsWith('refused kept written version 1 of model "tiny"') && m.includes('the record is corrupt or not this weightd\'s')), JSON.stringify(warned));
  assert.ok(warned.some((m) => m.includes('written version 3 of model "tiny" is in written format 99')), JSON.stringify(warned));
  assert.ok(warned.some((m) => m.includes('under someone-else') && m.includes('is not JSON')), JSON.stringify(warned));
});

test('a written version of a model this start does not plan is refused, naming the model', async () => {
  const base = await checkpoint();
  const { log, lines } = capture();
  const other = { ...base, spec: { ...base.spec, name: 'another' } };
  const restored = restoreWritten({ records: [keptVersion(base, 1, '2026-12-05T01:00:00.000Z')], planned: [other], devices: [base.devices[0]!.uuid], log });
  assert.equal(restored.models, []);
  assert.ok(lines().some((l) => l.msg.includes('no model named "tiny" is on this command line or restored')), JSON.stringify(lines()));
});

test.run();
