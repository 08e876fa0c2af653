// A plan kept with a model's shards (docs/spec/kept-plan.md): its key and packing are held to the
// shared vectors (test/vectors/kept-plan.json), and a start finds it only when every check of §4
// passes: each case below names the check that refuses it.
import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { canonicalJson } from '../../src/checkpoint/canonicalJson.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';
import type { KeptRecord as ListedRecord } from '../../src/keeper/keeperProtocol.js';
import { chooseKeptPlan, findKeptPlan, packPlan, readKeptPlans, PLANNER_ENTRY, planInputIdentities, planKey, planKeyFields, plannerDigest, plannerModules, unpackPlan, type KeptPlan, type PlanKeyFields } from '../../src/keeper/keptPlan.js';
import { encodeKeptRecord, keptPlanIn, keptRecordFor } from '../../src/keeper/keptRecord.js';
import { fillPlanOf } from '../../src/checkpoint/types.js';
import { modelPlacement, readKeptPlansAhead } from '../../src/models/planModel.js';
import type { ModelSpec } from '../../src/models/modelSpecs.js';
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

function listed(fingerprint: string, record: Buffer, ownerAlive = false, device = DEVICE): ListedRecord {
  return { device, fingerprint, fdCount: 1, ageMs: 0, ownerPid: 0, ownerAlive, expiresInMs: 1000, record };
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

test('the plans read before the devices are known are picked by device, with findKeptPlan\'s reasons, and nothing is read again', async () => {
  const m = await keptModel();
  const [record] = m.records;
  // The same shard kept on two devices (two daemons' GPUs, one keeper), and a live owner's on a third.
  const records = [listed(record!.fingerprint, record!.record, false, 'gpu-a'), listed(record!.fingerprint, record!.record, false, 'gpu-b'), listed(record!.fingerprint, record!.record, true, 'gpu-c')];
  let parsed = 0;
  const read = await readKeptPlans(records, m.fields, 0, (bytes) => (parsed++, keptPlanIn(bytes)));
  assert.equal(read.plans.map((p) => p.device), ['gpu-a', 'gpu-b'], 'one plan per device whose owner ended, in the records\' order');
  assert.is(parsed, 2, 'a live owner\'s record is not read');
  for (const device of ['gpu-a', 'gpu-b']) {
    const found = chooseKeptPlan(read, records, m.fields, { devices: [device], firstGlobalRank: 0 });
    assert.ok('plan' in found, why(found));
    assert.equal(found, await findKeptPlan(records, m.fields, { devices: [device], firstGlobalRank: 0 }, keptPlanIn));
  }
  assert.is(parsed, 2, 'picking reads no record');
  for (const devices of [['gpu-c'], ['gpu-d']]) {
    const picked = chooseKeptPlan(read, records, m.fields, { devices, firstGlobalRank: 0 });
    assert.match(why(picked), new RegExp(`^no record of device ${devices[0]} carries a plan for these options$`));
    assert.equal(picked, await findKeptPlan(records, m.fields, { devices, firstGlobalRank: 0 }, keptPlanIn));
  }
  // Other options: no plan is read, and the pick says why, as findKeptPlan does.
  const other = await readKeptPlans(records, { ...m.fields, layouts: ['vllm'] }, 0, keptPlanIn);
  assert.equal(other.plans, []);
  assert.match(why(chooseKeptPlan(other, records, { ...m.fields, layouts: ['vllm'] }, { devices: ['gpu-b'], firstGlobalRank: 0 })), /^no record of device gpu-b carries a plan for these options: a plan kept for other options \(layouts differ\)$/);
});

test('a start reads the kept plan and the page cache\'s share ahead of the devices; a model with no placement reads nothing ahead and rejects nothing', async () => {
  const m = await keptModel();
  const spec = { ...m.spec, name: 'tiny' } as unknown as ModelSpec;
  const node = { nnodes: 1, nodeRank: 0, localWorldSize: 1, tpSize: 1, device: 'cuda' as const };
  const ahead = readKeptPlansAhead(spec, node, { records: m.records, writer: WRITER }).ahead!;
  const read = await ahead.read;
  assert.equal(read?.plans.map((p) => [p.device, 'plan' in p.read]), [[DEVICE, true]]);
  const share = await ahead.share;
  assert.equal(share?.files, m.plan.ranks[0]!.files, 'the share is of the files the plan names');
  assert.ok(share!.share >= 0 && share!.share <= 1);
  assert.is(await readKeptPlansAhead(spec, { ...node, device: 'host' }, { records: m.records, writer: WRITER }).ahead!.share, undefined, 'nothing to measure on the host backend');
  // tp 3 over two nodes of two ranks: no placement. planModel says so by name; ahead, nothing.
  const kept = { records: m.records, writer: WRITER };
  const unplaced = readKeptPlansAhead({ ...spec, tpSize: 3 } as ModelSpec, { ...node, nnodes: 2, localWorldSize: 2, tpSize: 4 }, kept);
  assert.is(unplaced, kept);
  assert.throws(() => modelPlacement(3, { nnodes: 2, nodeRank: 0, localWorldSize: 2, tpSize: 4 }), /fits no placement/);
});

test('a file added to the checkpoint directory changes the directory: the plan is made again', async () => {
  const m = await keptModel();
  afterCtimeOf(m.spec.modelDir);
  writeFileSync(join(m.spec.modelDir, 'model-00003-of-00003.safetensors'), '');
  assert.match(why(await findKeptPlan(m.records, m.fields, local, keptPlanIn)), /^files the plan was made from changed since it was kept \(tiny: (mtime|ctime) /);
});

test('another build of one version whose planning code differs keys its plans apart, in src/checkpoint or in a module it imports from elsewhere', async () => {
  const m = await keptModel();
  const src = fileURLToPath(new URL('../../src/', import.meta.url));
  // The compiled planning modules as this build runs them, copied: another build's once one is changed.
  const code = freshTempDir();
  for (const f of plannerModules(src)) {
    mkdirSync(dirname(join(code, f)), { recursive: true });
    cpSync(join(src, f), join(code, f));
  }
  assert.is(plannerDigest(code), m.fields.planner, "this start's key names the planning code it runs");
  // A sharding rule, and the readers planning parses headers and the index with (src/files).
  for (const f of ['checkpoint/tpRules.js', 'files/parseBoundedJson.js', 'files/openRegularFile.js']) {
    const was = readFileSync(join(code, f));
    writeFileSync(join(code, f), `${was}\n`);
    const other = planKeyFields(m.spec, WRITER, plannerDigest(code));
    assert.is(other.writer, m.fields.writer, 'the same version');
    assert.match(why(await findKeptPlan(m.records, other, local, keptPlanIn)), /a plan kept for other options \(planner differ\)$/, f);
    writeFileSync(join(code, f), was);
  }
});

test('the planner digest covers every module Node loads for planning, and the header worker it starts by URL', () => {
  const src = fileURLToPath(new URL('../../src/', import.meta.url));
  const dir = freshTempDir();
  const log = join(dir, 'loaded.txt');
  // A load hook that writes each module's URL before it loads, so the list is whole once the import resolves.
  writeFileSync(join(dir, 'hooks.mjs'), "import { appendFileSync } from 'node:fs'; let log; export function initialize(data) { log = data.log; } export async function load(url, context, next) { appendFileSync(log, url + '\\n'); return next(url, context); }\n");
  writeFileSync(join(dir, 'loads.mjs'), `import { register } from 'node:module'; register('./hooks.mjs', import.meta.url, { data: { log: ${JSON.stringify(log)} } }); await import(${JSON.stringify(pathToFileURL(join(src, PLANNER_ENTRY)).href)});\n`);
  const run = spawnSync(process.execPath, [join(dir, 'loads.mjs')], { encoding: 'utf8' });
  assert.is(run.status, 0, run.stderr);
  const loaded = readFileSync(log, 'utf8').split('\n').filter((u) => u.startsWith(pathToFileURL(src).href)).map((u) => relative(src, fileURLToPath(u)));
  const walked = plannerModules(src);
  assert.ok(loaded.length > 10 && loaded.includes('files/parseBoundedJson.js') && loaded.includes('files/openRegularFile.js'), loaded.join(' '));
  assert.equal(loaded.filter((f) => !walked.includes(f)), [], 'every module planning loads is in the digest');
  assert.ok(walked.includes('checkpoint/headerWorker.js'), 'the worker parseShards starts by URL is in it too');
});

test.run();
