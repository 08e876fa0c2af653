// Which written versions a start restores from the keeper's records (src/actors/restoreWritten.ts):
// each is planned on its model's checkpoint version with the fingerprint its records' fields and
// digests make; a record that does not add up (a digest changed: corrupt), of a written format
// this weightd does not read, or not weightd's at all is refused alone, by name, and never served;
// so is one written over another checkpoint than the one planned now, or whose tensors' names,
// dtypes, shapes or places are not the plan's (src/keeper/writtenIdentity.ts); the version whose
// records were kept last is the current one.
import { cpSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { rankFingerprint, writtenVersionFingerprint } from '../../src/checkpoint/fingerprint.js';
import { fillPlanOf } from '../../src/checkpoint/types.js';
import type { KeptRecord as ListedRecord } from '../../src/keeper/keeperProtocol.js';
import { keptRecordFor, WRITTEN_FORMAT } from '../../src/keeper/keptRecord.js';
import { manifestDigest } from '../../src/keeper/writtenIdentity.js';
import { restoreWritten } from '../../src/actors/restoreWritten.js';
import { planModel, type PlannedModel } from '../../src/models/planModel.js';
import { resolveModelSpec } from '../../src/models/modelSpecs.js';
import { resolveNodeOptions } from '../../src/nodeOptions.js';
import { exampleModel, freshTempDir } from '../helpers/paths.js';

function capture(): { log: pino.Logger; lines: () => Array<{ msg: string; [k: string]: unknown }> } {
  const out: string[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void out.push(s) });
  return { log, lines: () => out.map((s) => JSON.parse(s) as { msg: string }) };
}

async function checkpoint(model = exampleModel): Promise<PlannedModel> {
  const config = await resolveNodeOptions({ model, device: 'host' });
  return planModel(resolveModelSpec({ model, name: 'tiny' }), config, pino({ level: 'silent' }));
}

const Q_PROJ = 'model.layers.0.self_attn.q_proj.weight';
const O_PROJ = 'model.layers.0.self_attn.o_proj.weight';

/** A copy of the example checkpoint in a directory of its own. */
function exampleCopy(): string {
  const dir = join(freshTempDir(), 'tiny-llama');
  cpSync(exampleModel, dir, { recursive: true });
  return dir;
}

/** Swaps the names of layer 0's q_proj and o_proj in `dir`'s first file's header, in place: same shapes, dtypes and name lengths, so no byte moves. */
function swapQAndO(dir: string): void {
  const path = join(dir, 'model-00001-of-00002.safetensors');
  const file = readFileSync(path);
  const n = Number(file.readBigUInt64LE(0));
  const header = file.subarray(8, 8 + n).toString('latin1');
  const swapped = header.replace(Q_PROJ, '\u0000').replace(O_PROJ, Q_PROJ).replace('\u0000', O_PROJ);
  assert.is.not(swapped, header);
  file.write(swapped, 8, 'latin1');
  writeFileSync(path, file);
}

/** The keeper's LIST entry of written version `version` of `base`'s model, kept at `keptAt`; `tamper` edits the record's JSON last. */
function keptVersion(base: PlannedModel, version: number, keptAt: string, tamper: (r: Record<string, unknown>) => void = () => {}): ListedRecord {
  const rank = base.plan.ranks[0]!;
  const digests = rank.tensors.map((_, i) => (version * 1000 + i).toString(16).padStart(32, '0'));
  const { fingerprint, fields } = writtenVersionFingerprint(base.plan.fingerprintFields, [digests]);
  const plan = { ...fillPlanOf(rank), fingerprint: rankFingerprint(fingerprint, 0) };
  const device = base.devices[0]!.uuid;
  const written = { format: WRITTEN_FORMAT, name: 'tiny', version, base: base.plan.fingerprint, fields, digests, manifest: manifestDigest(base.plan.ranks), shared: [] };
  const record = keptRecordFor({ backend: 'host', handleType: 'memfd', device, plan, files: [] }, base.spec.modelDir, 'weightd test', undefined, [], undefined, new Date(keptAt), { written, currentSince: Date.parse(keptAt) }) as unknown as Record<string, unknown>;
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

test('a version kept over a checkpoint whose header then swapped two names (nothing moved) is refused, naming the header field', async () => {
  const dir = exampleCopy();
  const before = await checkpoint(dir);
  const records = [keptVersion(before, 1, '2026-12-05T01:00:00.000Z')];
  swapQAndO(dir);
  const after = await checkpoint(dir);
  const q = (m: PlannedModel, name: string) => m.plan.ranks[0]!.tensors.find((t) => t.name === name)!;
  // What the arena check saw: the same places, so it let the version serve its q_proj's bytes as o_proj.
  assert.equal([q(after, Q_PROJ).offset, q(after, O_PROJ).offset], [q(before, O_PROJ).offset, q(before, Q_PROJ).offset]);
  const { log, lines } = capture();
  const restored = restoreWritten({ records, planned: [after], devices: [after.devices[0]!.uuid], log });
  assert.equal(restored.models, []);
  assert.equal(restored.current, []);
  const warned = lines().filter((l) => l.level === 40).map((l) => l.msg);
  assert.ok(warned.some((m) => m.startsWith('refused kept written version 1 of model "tiny"') && m.includes("fingerprint's headers")), JSON.stringify(warned));
});

test("a version whose records' manifest is not the plan's is refused, whatever the fields say", async () => {
  const base = await checkpoint();
  const records = [keptVersion(base, 1, '2026-12-05T01:00:00.000Z')];
  // The same fields and arena, two tensors' views exchanged (as a change of the planning code would).
  const rank = base.plan.ranks[0]!;
  const tensors = rank.tensors.map((t) => (t.name === Q_PROJ ? { ...t, name: O_PROJ } : t.name === O_PROJ ? { ...t, name: Q_PROJ } : t));
  const planned = { ...base, plan: { ...base.plan, ranks: [{ ...rank, tensors }] } };
  const { log, lines } = capture();
  const restored = restoreWritten({ records, planned: [planned], devices: [base.devices[0]!.uuid], log });
  assert.equal(restored.models, []);
  assert.ok(lines().some((l) => l.level === 40 && l.msg.includes('its tensors (names, dtypes, shapes, places) are not the ones model "tiny" has now')), JSON.stringify(lines()));
  assert.equal(restoreWritten({ records, planned: [base], devices: [base.devices[0]!.uuid], log }).models.map((m) => m.version), [1], 'the same plan restores it');
});

test('a version written over another directory\'s checkpoint of the same name and layout is refused, naming both directories', async () => {
  const written = await checkpoint();
  const records = [keptVersion(written, 1, '2026-12-05T01:00:00.000Z')];
  // A copy of the same bytes: no field differs, only the directory the operator names.
  const other = await checkpoint(exampleCopy());
  assert.is(other.plan.fingerprint, written.plan.fingerprint);
  const { log, lines } = capture();
  const restored = restoreWritten({ records, planned: [other], devices: [other.devices[0]!.uuid], log });
  assert.equal(restored.models, []);
  assert.equal(restored.current, [], 'the checkpoint the command line names stays current');
  const warned = lines().filter((l) => l.level === 40).map((l) => l.msg);
  assert.ok(warned.some((m) => m.includes(`written over the checkpoint in ${written.spec.modelDir}`) && m.includes(`from ${other.spec.modelDir}`)), JSON.stringify(warned));
});

test('a record of written format 1 (no manifest) is refused, naming its format, never restored', async () => {
  const base = await checkpoint();
  const old = keptVersion(base, 1, '2026-12-05T01:00:00.000Z', (r) => {
    const w = r.written as { format: number; manifest?: string };
    w.format = 1;
    delete w.manifest;
  });
  const { log, lines } = capture();
  const restored = restoreWritten({ records: [old], planned: [base], devices: [base.devices[0]!.uuid], log });
  assert.equal(restored.models, []);
  assert.ok(lines().some((l) => l.level === 40 && l.msg.includes('written version 1 of model "tiny" is in written format 1, and this weightd reads written formats 2')), JSON.stringify(lines()));
});

test.run();
