// Which cut planModel gives a model's arenas (issue 33): the host default on the host backend,
// one segment on cuda; and, on a restart that plans from the headers, one segment where the
// keeper holds the model's shards or written versions in one, as every build before the default
// kept them, so that the restart adopts those shards (checkKeptRecord) instead of reading the
// checkpoint again.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { fillPlanOf, type CheckpointPlan } from '../../src/checkpoint/types.js';
import type { KeptRecord as ListedRecord } from '../../src/keeper/keeperProtocol.js';
import { checkKeptRecord, encodeKeptRecord, keptRecordFor, WRITTEN_FORMAT } from '../../src/keeper/keptRecord.js';
import type { DeviceSlot } from '../../src/native/addon.js';
import { planModel } from '../../src/models/planModel.js';
import { resolveModelSpec } from '../../src/models/modelSpecs.js';
import { resolveNodeOptions } from '../../src/nodeOptions.js';
import { freshTempDir } from '../helpers/paths.js';
import { LAYER_BYTES, writeSparseLlama } from '../helpers/sparseLlama.js';

const WRITER = 'weightd test';
const HOST: DeviceSlot = { backend: 'host', index: 0, uuid: 'host-seg-test-0' };
const silent = pino({ level: 'silent' });

const dir = freshTempDir();
await writeSparseLlama(dir, 12);
const spec = resolveModelSpec({ model: dir, name: 'sparse' });
const config = await resolveNodeOptions({ model: dir, device: 'host' });
/** The plan every build before the default made, and the current one's. */
const whole = await planCheckpoint(dir, { tpSize: 1 });
const cut = await planCheckpoint(dir, { tpSize: 1, segments: 'host' });

/** The keeper's LIST entry of rank 0's shard of `plan` on `device`. */
function kept(plan: CheckpointPlan, { device = HOST.uuid, ownerAlive = false, written = false } = {}): ListedRecord {
  const rank = plan.ranks[0]!;
  const record = keptRecordFor({ backend: 'host', handleType: 'memfd', device, plan: fillPlanOf(rank), files: plan.files }, spec.name, WRITER, undefined, [], undefined, new Date(), written
    ? { written: { format: WRITTEN_FORMAT, name: spec.name, version: 1, base: plan.fingerprint, fields: {}, digests: [], manifest: '0'.repeat(64), shared: [] } }
    : {});
  // A written version's records are under its own fingerprint, not the checkpoint's.
  return { device, fingerprint: written ? 'f'.repeat(64) : rank.fingerprint, fdCount: rank.segments.length, ageMs: 0, ownerPid: 0, ownerAlive, expiresInMs: 1000, record: encodeKeptRecord(record) };
}

const segmentsOf = async (records?: ListedRecord[], devices = [HOST]) =>
  (await planModel(spec, config, silent, devices, records && { records, writer: WRITER })).plan.ranks[0]!.segments;

/** Whether rank 0 of this start would adopt `record` (the check a rank runs before TAKE). */
const adopts = (record: ListedRecord, plan: CheckpointPlan) =>
  'record' in checkKeptRecord(record.record, { backend: 'host', handleType: 'memfd', device: HOST.uuid, plan: fillPlanOf(plan.ranks[0]!), files: plan.files });

test('a host arena of 384 MiB is cut into six 64 MiB segments, with or without a keeper; a cuda arena stays one segment', async () => {
  assert.equal(await segmentsOf(), Array(6).fill(2 * LAYER_BYTES));
  assert.equal(await segmentsOf([]), Array(6).fill(2 * LAYER_BYTES));
  assert.equal(await segmentsOf(undefined, [{ backend: 'cuda', index: 0, uuid: 'GPU-seg-test' }]), [12 * LAYER_BYTES]);
});

test("a restart over an earlier build's one-segment shard plans one segment and adopts it", async () => {
  const record = kept(whole);
  const planned = await planModel(spec, config, silent, [HOST], { records: [record], writer: WRITER });
  assert.equal(planned.plan.ranks[0]!.segments, [12 * LAYER_BYTES]);
  assert.ok(adopts(record, planned.plan), 'the kept shard is adoptable into the plan');
  // What the default alone would have planned refuses it: the reason for the rule.
  assert.not.ok(adopts(record, cut));
});

test('a shard kept in segments by this build is cut the same way again, and adopted', async () => {
  const record = kept(cut);
  const planned = await planModel(spec, config, silent, [HOST], { records: [record], writer: WRITER });
  assert.equal(planned.plan.ranks[0]!.segments, Array(6).fill(2 * LAYER_BYTES));
  assert.ok(adopts(record, planned.plan));
});

test("a one-segment written version of this model keeps its checkpoint whole, where the written version is served only in its checkpoint's layout", async () => {
  assert.equal(await segmentsOf([kept(whole, { written: true })]), [12 * LAYER_BYTES]);
});

test('one-segment records a live daemon owns, or of another device, leave the default cut', async () => {
  assert.equal(await segmentsOf([kept(whole, { ownerAlive: true })]), Array(6).fill(2 * LAYER_BYTES));
  assert.equal(await segmentsOf([kept(whole, { device: 'host-seg-test-other' })]), Array(6).fill(2 * LAYER_BYTES));
});

test.run();
