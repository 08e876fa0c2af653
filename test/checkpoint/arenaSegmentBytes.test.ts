// The host backend's default cut of a rank's arena (issue 33): segments of at least 64 MiB, at
// most 16 a rank, none below 128 MiB; a plan file's segmentBytes wins; the cut changes where the
// tensors lie, never which bytes they hold or the fingerprint a client expects.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { HOST_SEGMENT_MIN_BYTES, HOST_SEGMENTS_MAX, hostSegmentBytes } from '../../src/checkpoint/arenaSegmentBytes.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { RankPlan } from '../../src/checkpoint/types.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { exampleModel } from '../helpers/paths.js';
import { LAYER_BYTES, writeSparseLlama } from '../helpers/sparseLlama.js';

const MiB = 1024 * 1024;

/** Each tensor's place: [name, segment, offset, bytes], and the arena's bytes in order. */
const places = (r: RankPlan) => r.tensors.map((t) => [t.name, t.segment, t.offset, t.bytes] as const);
const arenaOffsets = (r: RankPlan) => r.tensors.map((t) => r.segments.slice(0, t.segment).reduce((a, b) => a + b, 0) + t.offset);

test('hostSegmentBytes: whole below twice the minimum; then at least the minimum and at most HOST_SEGMENTS_MAX segments', () => {
  assert.is(HOST_SEGMENT_MIN_BYTES, 64 * MiB);
  assert.is(HOST_SEGMENTS_MAX, 16);
  for (const bytes of [0, 1, 48 * MiB, 128 * MiB - 1]) assert.is(hostSegmentBytes(bytes), Infinity, `${bytes}`);
  assert.is(hostSegmentBytes(128 * MiB), 64 * MiB);
  assert.is(hostSegmentBytes(1024 * MiB), 64 * MiB);
  assert.is(hostSegmentBytes(1024 * MiB + 16), 64 * MiB + 1);
  const big = 140 * 1024 * MiB;
  assert.is(hostSegmentBytes(big), Math.ceil(big / 16));
});

test("'host' cuts a 384 MiB arena into 64 MiB segments at tensor boundaries: same tensors, same bytes in arena order, same fingerprint", async () => {
  const dir = makeTempDir('host-seg');
  try {
    await writeSparseLlama(dir, 12);
    const whole = await planCheckpoint(dir, { tpSize: 1 });
    const host = await planCheckpoint(dir, { tpSize: 1, segments: 'host' });
    assert.equal(whole.ranks[0]!.segments, [12 * LAYER_BYTES]);
    assert.equal(host.ranks[0]!.segments, Array(6).fill(2 * LAYER_BYTES));
    assert.is(host.fingerprint, whole.fingerprint);
    assert.is(host.ranks[0]!.fingerprint, whole.ranks[0]!.fingerprint);
    assert.equal(arenaOffsets(host.ranks[0]!), arenaOffsets(whole.ranks[0]!));
    assert.equal(host.ranks[0]!.tensors.map((t) => t.segment), [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    assert.is(host.ranks[0]!.totalBytes, whole.ranks[0]!.totalBytes);
    // Each rank of tp=2 holds half of each tensor (192 MiB): 64 MiB segments again, 3 a rank.
    const tp2 = await planCheckpoint(dir, { tpSize: 2, segments: 'host' });
    for (const r of tp2.ranks) assert.equal(r.segments, Array(3).fill(4 * LAYER_BYTES / 2), `rank ${r.tpRank}`);
  } finally {
    removeDir(dir);
  }
});

test("'host' cuts at most 16 segments a rank: 1.25 GiB in 14 of 96 MiB, each but the last at least 1/16 of the arena", async () => {
  const dir = makeTempDir('host-seg-max');
  try {
    await writeSparseLlama(dir, 40);
    const r = (await planCheckpoint(dir, { tpSize: 1, segments: 'host' })).ranks[0]!;
    assert.ok(r.segments.length <= HOST_SEGMENTS_MAX, `${r.segments.length} segments`);
    assert.is(r.segments.length, 14);
    for (const bytes of r.segments.slice(0, -1)) assert.ok(bytes >= (40 * LAYER_BYTES) / 16, `${bytes}`);
    assert.is(r.segments.reduce((a, b) => a + b, 0), 40 * LAYER_BYTES);
  } finally {
    removeDir(dir);
  }
});

test("'host' leaves an arena below 128 MiB whole, as 'whole' plans it (the example model, 96 MiB), and cuts one of 128 MiB in two", async () => {
  const same = async (modelDir: string) => {
    const whole = await planCheckpoint(modelDir, { tpSize: 1 });
    const host = await planCheckpoint(modelDir, { tpSize: 1, segments: 'host' });
    assert.is(host.ranks[0]!.segments.length, 1, modelDir);
    assert.equal(JSON.parse(JSON.stringify(host)), JSON.parse(JSON.stringify(whole)));
  };
  await same(exampleModel);
  const small = makeTempDir('host-seg-small');
  const least = makeTempDir('host-seg-least');
  try {
    await writeSparseLlama(small, 3);
    await same(small);
    await writeSparseLlama(least, 4);
    assert.equal((await planCheckpoint(least, { tpSize: 1, segments: 'host' })).ranks[0]!.segments, [2 * LAYER_BYTES, 2 * LAYER_BYTES]);
  } finally {
    removeDir(small);
    removeDir(least);
  }
});

test("a plan file's segmentBytes wins over 'host', larger or smaller", async () => {
  const dir = makeTempDir('host-seg-planfile');
  try {
    await writeSparseLlama(dir, 12);
    const planFile = (segmentBytes: number) => {
      const path = join(dir, `plan-${segmentBytes}.json`);
      writeFileSync(path, JSON.stringify({ rules: [], segmentBytes }));
      return path;
    };
    assert.is((await planCheckpoint(dir, { tpSize: 1, segments: 'host' })).ranks[0]!.segments.length, 6);
    const larger = await planCheckpoint(dir, { tpSize: 1, segments: 'host', planFile: planFile(1024 * MiB) });
    assert.equal(larger.ranks[0]!.segments, [12 * LAYER_BYTES]);
    const smaller = await planCheckpoint(dir, { tpSize: 1, segments: 'host', planFile: planFile(LAYER_BYTES) });
    assert.equal(smaller.ranks[0]!.segments, Array(12).fill(LAYER_BYTES));
    assert.equal(places(smaller.ranks[0]!), places((await planCheckpoint(dir, { tpSize: 1, planFile: planFile(LAYER_BYTES) })).ranks[0]!));
  } finally {
    removeDir(dir);
  }
});

test('a cut chosen by a function gets every rank\'s fingerprint before any rank is cut', async () => {
  const dir = makeTempDir('host-seg-fn');
  try {
    await writeSparseLlama(dir, 12);
    const seen: string[][] = [];
    const plan = await planCheckpoint(dir, { tpSize: 2, segments: (fingerprints) => (seen.push([...fingerprints]), 'whole') });
    assert.equal(seen, [plan.ranks.map((r) => r.fingerprint)]);
    for (const r of plan.ranks) assert.is(r.segments.length, 1);
  } finally {
    removeDir(dir);
  }
});

test.run();
