// A plan kept with a model's shards (docs/spec/kept-plan.md): its key and packing are held to the
// shared vectors (test/vectors/kept-plan.json), and a start finds it only when every check of §4
// passes: each case below names the check that refuses it.
import { createHash } from 'node:crypto';
import { cpSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { canonicalJson } from '../../src/checkpoint/canonicalJson.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';
import type { KeptRecord as ListedRecord } from '../../src/keeper/keeperProtocol.js';
import { findKeptPlan, packPlan, planInputIdentities, planKey, planKeyFields, plannerDigest, unpackPlan, type KeptPlan, type PlanKeyFields } from '../../src/keeper/keptPlan.js';
import { encodeKeptRecord, keptPlanIn, keptRecordFor } from '../../src/keeper/keptRecord.js';
import { fillPlanOf } from '../../src/checkpoint/types.js';
import { afterCtimeOf } from '../helpers/fileClock.js';
import { exampleModel, freshTempDir, repoRoot } from '../helpers/paths.js';

interface Vectors {
  keys: Array<{ fields: PlanKeyFields; canonical: string; key: string }>;
  packed: Array<{ json: string; bytes: number; sha256: string; brotli: string }>;
  corrupt: Array<{ brotli: string; bytes: number; sha256: string; why: string }>;
}
const vectors = JSON.parse(readFileSync(join(repoRoot, 'test/vectors/kept-plan.json'), 'utf8')) as Vectors;

test('the key of a plan\'s options is the SHA-256 of their canonical JSON (vectors)', () => {
  for (const v of vectors.keys) {
    assert.is(canonicalJson(v.fields), v.canonical);
    assert.is(createHash('sha256').update(v.canonical).digest('hex'), v.key);
    assert.is(planKey(v.fields), v.key);
  }
});

test('a packed plan unpacks to its bytes; one whose bytes, length or digest differ is corrupt (vectors)', async () => {
  for (const v of vectors.packed) {
    const json = await unpackPlan(v);
    assert.ok(Buffer.isBuffer(json), JSON.stringify(json));
    assert.is((json as Buffer).toString('utf8'), v.json);
  }
  for (const v of vectors.corrupt) {
    const got = await unpackPlan(v);
    assert.not.ok(Buffer.isBuffer(got), v.why);
    assert.match((got as { why: string }).why, /it is corrupt$/, v.why);
  }
});

const DEVICE = 'host-test-0';
const WRITER = 'weightd test';

/** A copy of the example (its files are changed here), planned, and the records a daemon that loaded it would have left. */
async function keptModel(): Promise<{ spec: { modelDir: string; tpSize: number; layouts: string[] }; plan: CheckpointPlan; kept: KeptPlan; fields: PlanKeyFields; records: ListedRecord[] }> {
  const modelDir = join(freshTempDir(), 'tiny');
  cpSync(exampleModel, modelDir, { recursive: true });
  const spec = { modelDir, tpSize: 1, layouts: [] };
  const inputs = planInputIdentities(spec);
  const plan = await planCheckpoint(modelDir, { tpSize: 1 });
  const fields = planKeyFields(spec, WRITER);
  const kept = await packPlan(plan, fields, inputs);
  const rank = plan.ranks[0]!;
  const record = encodeKeptRecord(keptRecordFor({ backend: 'host', handleType: 'memfd', device: DEVICE, plan: fillPlanOf(rank), files: plan.files }, modelDir, WRITER, undefined, [], kept));
  return { spec, plan, kept, fields, records: [listed(rank.fingerprint, record)] };
}

function listed(fingerprint: string, record: Buffer, ownerAlive = false): ListedRecord {
  return { device: DEVICE, fingerprint, fdCount: 1, ageMs: 0, ownerPid: 0, ownerAlive, expiresInMs: 1000, record };
}

const local = { devices: [DEVICE], firstGlobalRank: 0 };
const why = (found: Awaited<ReturnType<typeof findKeptPlan>>) => ('why' in found ? found.why : '(found)');

test('the plan kept with the shard is found when nothing changed, and is the plan the headers give', async () => {
  const m = await keptModel();
  const found = await findKeptPlan(m.records, m.fields, local, keptPlanIn);
  assert.ok('plan' in found, why(found));
  assert.equal(JSON.parse(JSON.stringify((found as { plan: CheckpointPlan }).plan)), JSON.parse(JSON.stringify(await planCheckpoint(m.spec.modelDir, { tpSize: 1 }))));
  assert.equal((found as { kept: KeptPlan }).kept, m.kept);
});

test('each check of §4 refuses by name: options, owner, format, shard, files', async () => {
  const m = await keptModel();
  const [record] = m.records;
  assert.match(why(await findKeptPlan(m.records, { ...m.fields, layouts: ['vllm'] }, local, keptPlanIn)), /carries a plan for these options: a plan kept for other options \(layouts differ\)$/);
  assert.match(why(await findKeptPlan(m.records, { ...m.fields, writer: 'weightd 9.9.9' }, local, keptPlanIn)), /\(writer differ\)$/);
  assert.match(why(await findKeptPlan([{ ...record!, ownerAlive: true }], m.fields, local, keptPlanIn)), /^no record of device host-test-0 carries a plan/, 'a live owner\'s record is not this start\'s');
  const plan = { ...m.kept, format: 2 };
  const withPlan = (p: unknown) => [listed(record!.fingerprint, Buffer.from(JSON.stringify({ ...JSON.parse(record!.record.toString()), plan: p })))];
  assert.match(why(await findKeptPlan(withPlan(plan), m.fields, local, keptPlanIn)), /^the kept plan is in format 2, and this weightd reads 1$/);
  assert.match(why(await findKeptPlan(withPlan({ ...m.kept, sha256: 'nope' }), m.fields, local, keptPlanIn)), /the kept record's plan is malformed at sha256/);
  assert.match(why(await findKeptPlan([listed('another-fingerprint', record!.record)], m.fields, local, keptPlanIn)), /not that shard's plan$/);
  assert.match(why(await findKeptPlan(withPlan({ ...m.kept, ranks: [record!.fingerprint, 'r1'] }), m.fields, local, keptPlanIn)), /^the kept plan names 2 ranks, and tp size is 1$/);
  // Two local ranks, the second's shard not kept: its rank reads the checkpoint anyway.
  const twoRanks = { ...m.fields, tpSize: 2 };
  const kept2 = { ...m.kept, fields: twoRanks, key: planKey(twoRanks), ranks: [record!.fingerprint, 'r1'] };
  assert.match(why(await findKeptPlan(withPlan(kept2), twoRanks, { devices: [DEVICE, 'host-test-1'], firstGlobalRank: 0 }, keptPlanIn)), /^the shard of local rank 1 \(device host-test-1, fingerprint r1\) is not kept/);

  const config = join(m.spec.modelDir, 'config.json');
  afterCtimeOf(config);
  writeFileSync(config, readFileSync(config));
  assert.match(why(await findKeptPlan(m.records, m.fields, local, keptPlanIn)), /^files the plan was made from changed since it was kept \(.*config\.json: mtime /);
});

test('a file added to the checkpoint directory changes the directory: the plan is made again', async () => {
  const m = await keptModel();
  afterCtimeOf(m.spec.modelDir);
  writeFileSync(join(m.spec.modelDir, 'model-00003-of-00003.safetensors'), '');
  assert.match(why(await findKeptPlan(m.records, m.fields, local, keptPlanIn)), /^files the plan was made from changed since it was kept \(tiny: (mtime|ctime) /);
});

test('another build of one version whose planning code differs keys its plans apart: the plan this build kept is not used there', async () => {
  const m = await keptModel();
  // The compiled planning modules as this build runs them, and a copy with one rule's module changed: another build's.
  const code = join(freshTempDir(), 'checkpoint');
  cpSync(fileURLToPath(new URL('../../src/checkpoint/', import.meta.url)), code, { recursive: true });
  assert.is(plannerDigest(code), m.fields.planner, "this start's key names the planning code it runs");
  const rules = join(code, 'tpRules.js');
  writeFileSync(rules, `${readFileSync(rules, 'utf8')}\n`);
  const other = planKeyFields(m.spec, WRITER, plannerDigest(code));
  assert.is(other.writer, m.fields.writer, 'the same version');
  assert.match(why(await findKeptPlan(m.records, other, local, keptPlanIn)), /a plan kept for other options \(planner differ\)$/);
});

test.run();
