// The fingerprint: equal for the same weights in another directory, different when the tp size,
// a dtype, a header byte, a sampled tensor byte, the sharding config or the plan changes, with
// the differing fields named. The shared vectors (fingerprintVectors.test.ts) pin the values.
import { cpSync, mkdirSync, openSync, readFileSync, closeSync, truncateSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { canonicalJson } from '../../src/checkpoint/canonicalJson.js';
import { BUILTIN_RULES, PROTOCOL_VERSION, rankFingerprint, sha256Hex } from '../../src/checkpoint/fingerprint.js';
import { parseShards, sampleShards, createHeaderPool } from '../../src/checkpoint/parseShards.js';
import { sampleWithAddon } from '../../src/native/sampleDigest.js';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { fileContentDigest, SAMPLE_BLOCK_BUDGET, SAMPLE_BLOCK_BYTES, SAMPLE_EDGE_BYTES, SAMPLE_WHOLE_LIMIT, sampleRanges } from '../../src/checkpoint/sampleContent.js';
import { FAMILIES } from '../../src/checkpoint/tpRules.js';
import { CheckpointError } from '../../src/errors.js';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';
import { architectureTensors, makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeCheckpoint } from '../helpers/checkpoints.js';
import { exampleModel } from '../helpers/paths.js';

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

/** sha256 of the tables BUILTIN_RULES 'weightd-rules@2' names. */
const RULES_TABLE_SHA256 = '0b8043d436b36616aa346441b4f9023bbb10426a90ff57f8839bbd6bc55f9c92';

const differing = (a: CheckpointPlan, b: CheckpointPlan): string[] => Object.keys(a.fingerprintFields).filter((k) => a.fingerprintFields[k] !== b.fingerprintFields[k]).sort();

test('the same checkpoint in another directory has the same fingerprint', async () => {
  cpSync(join(root, 'a'), join(root, 'copy'), { recursive: true });
  const copy = await planCheckpoint(join(root, 'copy'), { tpSize: 2 });
  assert.is(copy.fingerprint, base.fingerprint);
  assert.equal(copy.fingerprintFields, base.fingerprintFields);
  assert.equal(copy.ranks.map((r) => r.fingerprint), base.ranks.map((r) => r.fingerprint));
});

test('fields: one hash per field, protocol version included; ranks derive from the checkpoint fingerprint', () => {
  assert.equal(Object.keys(base.fingerprintFields).sort(), ['architecture', 'config', 'content', 'dtypes', 'headers', 'plan', 'protocol', 'quantization', 'tpSize']);
  assert.is(PROTOCOL_VERSION, 2);
  assert.is(base.fingerprintFields.protocol, sha256Hex('2'));
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

test('a plan file enters as the hash of its canonical JSON: any plan file changes plan, a reformatted one does not', async () => {
  const rules = [{ pattern: 'o_proj\\.weight$', rule: 'row' }];
  const planFile = join(root, 'plan.json');
  writeFileSync(planFile, JSON.stringify({ rules }));
  const other = await planCheckpoint(join(root, 'a'), { tpSize: 2, planFile });
  assert.equal(differing(base, other), ['plan']);
  assert.is(other.fingerprintFields.plan, sha256Hex(canonicalJson({ builtinRules: BUILTIN_RULES, planFile: sha256Hex(canonicalJson({ rules })) })));
  const reformatted = join(root, 'pretty.json');
  writeFileSync(reformatted, JSON.stringify({ rules: [{ rule: 'row', pattern: 'o_proj\\.weight$' }] }, null, 4));
  assert.is((await planCheckpoint(join(root, 'a'), { tpSize: 2, planFile: reformatted })).fingerprint, other.fingerprint);
});

test('the head counts the rules read are the config field', async () => {
  const dir = join(root, 'config');
  cpSync(join(root, 'a'), dir, { recursive: true });
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, num_key_value_heads: 2, transformers_version: 'other' }));
  const other = await planCheckpoint(dir, { tpSize: 2 });
  assert.equal(differing(base, other), ['config']);
});

// The case: a copy of the example with 4 KiB of one tensor overwritten.
test('4 KiB of one tensor overwritten changes only the content field', async () => {
  const dir = join(root, 'tampered');
  cpSync(exampleModel, dir, { recursive: true });
  const file = join(dir, 'model-00001-of-00002.safetensors');
  const [header] = await parseShards([file]);
  const tensor = header!.tensors.find((t) => t.name === 'model.layers.0.self_attn.q_proj.weight')!;
  const fd = openSync(file, 'r+');
  writeSync(fd, Buffer.alloc(4096, 0xab), 0, 4096, tensor.begin + 1000);
  closeSync(fd);
  const [original, tampered] = [await planCheckpoint(exampleModel, { tpSize: 2 }), await planCheckpoint(dir, { tpSize: 2 })];
  assert.is.not(tampered.fingerprint, original.fingerprint);
  assert.equal(differing(original, tampered), ['content']);
});

test('a file cut short after its header was read fails the sampling instead of matching', async () => {
  const dir = join(root, 'shrinking');
  cpSync(join(root, 'a'), dir, { recursive: true });
  const file = join(dir, 'model-00002-of-00002.safetensors');
  const header = await parseSafetensors(file);
  truncateSync(file, header.fileSize - 10);
  await rejectsWith(() => sampleShards([header]), CheckpointError, 'E_ST_DATA_TRUNCATED', file);
  // Through the addon (a daemon's planning) and the pool too, with the error's class and code intact.
  await rejectsWith(() => sampleShards([header], undefined, sampleWithAddon), CheckpointError, 'E_ST_DATA_TRUNCATED', file);
  const pool = createHeaderPool(1);
  try {
    await rejectsWith(() => sampleShards([header], pool), CheckpointError, 'E_ST_DATA_TRUNCATED', file);
  } finally {
    await pool.destroy();
  }
});

test('sampling in a pool, and by the addon, gives the digests sampling inline gives', async () => {
  const headers = await parseShards([join(root, 'a', 'model-00001-of-00002.safetensors'), join(root, 'a', 'model-00002-of-00002.safetensors')]);
  const pool = createHeaderPool(1);
  try {
    const inline = await sampleShards(headers);
    assert.equal(await sampleShards(headers, pool), inline);
    assert.equal(await sampleShards(headers, undefined, sampleWithAddon), inline);
    // The addon's reads and hash, file by file, in both regimes: whole, and edges and blocks
    // (as in a checkpoint past SAMPLE_WHOLE_LIMIT, which these tensors are a part of).
    for (const h of headers) {
      const spans = h.tensors.flatMap((t) => [t.begin, t.end]);
      for (const total of [1, 1e12]) {
        assert.is(await sampleWithAddon(h.path, spans, total, 0), fileContentDigest(h.path, spans, total, 0), `${h.path}, ${total} bytes in all`);
      }
    }
  } finally {
    await pool.destroy();
  }
});

const sampledBytes = (r: number[]): number => r.reduce((sum, v, i) => sum + (i % 2 ? v : -v), 0);

test('the sample: whole up to the limit, then edges plus a fixed block budget however many tensors', () => {
  assert.equal(sampleRanges([100, 5000, 5000, 9000], SAMPLE_WHOLE_LIMIT), [100, 9000]);
  // 100 GB in 50,000 tensors: every tensor's edges, and interior blocks within the budget.
  const n = 2_000_000;
  const count = 50_000;
  const spans = Array.from({ length: count }, (_, i) => [i * n, (i + 1) * n]).flat();
  const ranges = sampleRanges(spans, n * count);
  // The whole budget is spent even though no tensor's own share reaches one block.
  assert.is(sampledBytes(ranges), count * 2 * SAMPLE_EDGE_BYTES + SAMPLE_BLOCK_BUDGET * SAMPLE_BLOCK_BYTES);
  for (let i = 2; i < ranges.length; i += 2) assert.ok(ranges[i]! > ranges[i - 1]!, 'ascending and disjoint');
  // Split over two files, the shares still add up to the budget.
  const half = spans.length / 2;
  const [first, second] = [sampleRanges(spans.slice(0, half), n * count, 0), sampleRanges(spans.slice(half), n * count, (n * count) / 2)];
  assert.is(sampledBytes(first) + sampledBytes(second), sampledBytes(ranges));
  // One 100 GB tensor: its edges and exactly the budget's blocks, evenly spaced.
  const big = 100e9;
  const one = sampleRanges([0, big], big);
  assert.is(sampledBytes(one), 2 * SAMPLE_EDGE_BYTES + SAMPLE_BLOCK_BUDGET * SAMPLE_BLOCK_BYTES);
  assert.is(one[0], 0);
  assert.is(one[one.length - 1], big);
});

// Rules enter the fingerprint as BUILTIN_RULES, not as a hash of these tables: a table edit
// that keeps the identifier would let two releases that shard differently match.
test('the built-in rule tables are the ones BUILTIN_RULES names (bump it when they change)', () => {
  const tables = FAMILIES.map((f) => ({ ...f, rules: f.rules.map((r) => ({ pattern: r.pattern.source, spec: r.spec })) }));
  assert.is(BUILTIN_RULES, 'weightd-rules@2');
  assert.is(sha256Hex(canonicalJson(tables)), RULES_TABLE_SHA256,
    'tpRules.ts changed: bump BUILTIN_RULES (fingerprint.ts and clients/python/weightd_client/fingerprint.py), regenerate test/vectors/fingerprint, then update RULES_TABLE_SHA256');
});

test.run();
