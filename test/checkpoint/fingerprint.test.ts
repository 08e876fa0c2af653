// The fingerprint: equal for the same weights in another directory, different when the tp size,
// a dtype, a header byte or the plan changes, with the differing fields named.
import { cpSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { PROTOCOL_VERSION, rankFingerprint, sha256Hex } from '../../src/checkpoint/fingerprint.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';
import { architectureTensors, makeTempDir, removeDir, writeArchCheckpoint, writeCheckpoint } from '../helpers/checkpoints.js';

let root = '';
let base: CheckpointPlan;
const OPTIONS = { layers: 1 };
test.before(async () => {
  root = makeTempDir('fp');
  mkdirSync(join(root, 'a'));
  await writeArchCheckpoint(join(root, 'a'), 'LlamaForCausalLM', OPTIONS);
  base = await planCheckpoint(join(root, 'a'), { tpSize: 2 });
});
test.after(() => removeDir(root));

const differing = (a: CheckpointPlan, b: CheckpointPlan): string[] => Object.keys(a.fingerprintFields).filter((k) => a.fingerprintFields[k] !== b.fingerprintFields[k]).sort();

test('the same checkpoint in another directory has the same fingerprint', async () => {
  cpSync(join(root, 'a'), join(root, 'copy'), { recursive: true });
  const copy = await planCheckpoint(join(root, 'copy'), { tpSize: 2 });
  assert.is(copy.fingerprint, base.fingerprint);
  assert.equal(copy.fingerprintFields, base.fingerprintFields);
  assert.equal(copy.ranks.map((r) => r.fingerprint), base.ranks.map((r) => r.fingerprint));
});

test('fields: one hash per field, protocol version included; ranks derive from the checkpoint fingerprint', () => {
  assert.equal(Object.keys(base.fingerprintFields).sort(), ['architecture', 'dtypes', 'headers', 'plan', 'protocol', 'quantization', 'tpSize']);
  assert.is(PROTOCOL_VERSION, 1);
  assert.is(base.fingerprintFields.protocol, sha256Hex('1'));
  assert.equal(base.ranks.map((r) => r.fingerprint), [rankFingerprint(base.fingerprint, 0), rankFingerprint(base.fingerprint, 1)]);
  assert.is.not(base.ranks[0]!.fingerprint, base.ranks[1]!.fingerprint);
});

test('another tp size changes the fingerprint (tpSize field)', async () => {
  const other = await planCheckpoint(join(root, 'a'), { tpSize: 4 });
  assert.is.not(other.fingerprint, base.fingerprint);
  assert.ok(differing(base, other).includes('tpSize'));
  assert.not.ok(differing(base, other).includes('headers'));
});

test('another dtype changes headers and dtypes', async () => {
  const dir = join(root, 'dtype');
  mkdirSync(dir);
  const tensors = architectureTensors('LlamaForCausalLM', { hidden: 64, heads: 8, kvHeads: 4, headDim: 8, intermediate: 128, vocab: 256, layers: 1, experts: 0 });
  for (const t of tensors) if (t.name === 'model.norm.weight') { t.dtype = 'F16'; }
  await writeCheckpoint(dir, JSON.parse(readFileSync(join(root, 'a', 'config.json'), 'utf8')), tensors);
  const other = await planCheckpoint(dir, { tpSize: 2 });
  assert.equal(differing(base, other), ['dtypes', 'headers']);
});

test('a header change alone (metadata) changes only the headers field', async () => {
  const dir = join(root, 'meta');
  cpSync(join(root, 'a'), dir, { recursive: true });
  const file = join(dir, 'model-00002-of-00002.safetensors');
  const bytes = readFileSync(file);
  const at = bytes.indexOf('"format":"pt"');
  bytes.write('"format":"PT"', at);
  writeFileSync(file, bytes);
  const other = await planCheckpoint(dir, { tpSize: 2 });
  assert.equal(differing(base, other), ['headers']);
});

test('a plan file that changes a rule changes the plan field', async () => {
  const planFile = join(root, 'plan.json');
  writeFileSync(planFile, JSON.stringify({ rules: [{ pattern: 'o_proj\\.weight$', rule: 'replicated' }] }));
  const other = await planCheckpoint(join(root, 'a'), { tpSize: 2, planFile });
  assert.equal(differing(base, other), ['plan']);
});

test('a plan file that changes nothing leaves the fingerprint as it was', async () => {
  const planFile = join(root, 'same.json');
  writeFileSync(planFile, JSON.stringify({ rules: [{ pattern: 'o_proj\\.weight$', rule: 'row' }] }));
  assert.is((await planCheckpoint(join(root, 'a'), { tpSize: 2, planFile })).fingerprint, base.fingerprint);
});

test.run();
