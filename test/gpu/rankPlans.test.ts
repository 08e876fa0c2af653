// The GPU check's planning half, runnable without a GPU: bench/gpu/rankPlans.mjs turns the
// daemon's plans (src/checkpoint) into what test/gpu/gpu-check.mjs fills and what its numpy
// slicer (expected-slices.py) computes independently. On the example checkpoint, a host fill
// of each rank's ops lands every tensor's bytes where its entry says, equal to an oracle that
// knows nothing of the planner, and the slicer's inputs (data range, shape, split dim) cut the
// same bytes out of the files.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { CopyOp } from '../../src/checkpoint/types.js';
import { bytesForElements, type SafetensorsDtype } from '../../src/checkpoint/dtypes.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { exampleModel, repoRoot } from '../helpers/paths.js';

interface SlicerTensor { name: string; path: string; begin: number; end: number; shape: number[]; dtype: string; dim: number | null; tp: number; rank: number; offset: number; bytes: number }
interface GpuRankPlan { files: string[]; ops: CopyOp[]; segmentBytes: number; payloadBytes: number; tensors: SlicerTensor[] }
const { rankPlans } = (await import(pathToFileURL(join(repoRoot, 'bench/gpu/rankPlans.mjs')).href)) as { rankPlans: (dir: string, tp: number) => Promise<GpuRankPlan[]> };

/** numpy's array_split of an evenly divisible dim, rank `rank` of `tp`: what expected-slices.py takes. */
function evenSlice(t: SlicerTensor): Buffer {
  const data = readFileSync(t.path).subarray(t.begin, t.end);
  if (t.dim === null) return data;
  const inner = bytesForElements(t.dtype as SafetensorsDtype, t.shape.slice(t.dim + 1).reduce((a, b) => a * b, 1))!;
  const outer = t.shape.slice(0, t.dim).reduce((a, b) => a * b, 1);
  const part = t.shape[t.dim]! / t.tp;
  const pieces: Buffer[] = [];
  for (let o = 0; o < outer; o++) {
    const start = (o * t.shape[t.dim]! + t.rank * part) * inner;
    pieces.push(data.subarray(start, start + part * inner));
  }
  return Buffer.concat(pieces);
}

test('tp=2: the GPU check fills the daemon\'s plan, and its slicer\'s inputs give the oracle\'s bytes', async () => {
  const plans = await rankPlans(exampleModel, 2);
  assert.is(plans.length, 2);
  for (const [rank, plan] of plans.entries()) {
    const oracle = expectedRank(exampleModel, 2, rank);
    assert.is(plan.tensors.length, oracle.size);
    assert.ok(plan.tensors.some((t) => t.dim === 1) && plan.tensors.some((t) => t.dim === 0) && plan.tensors.some((t) => t.dim === null), 'row, column and replicated tensors');
    const device = new DeviceHandle('host', 0, { uuid: `rank-plans-${process.pid}-${rank}` });
    try {
      await device.allocate([plan.segmentBytes]);
      await device.fill(plan.files, plan.ops, plan.payloadBytes, {});
      for (const t of plan.tensors) {
        const want = oracle.get(t.name)!.bytes;
        assert.ok((await device.read(0, t.offset, t.bytes)).equals(want), `${t.name}: the filled bytes differ from the oracle's`);
        assert.ok(evenSlice(t).equals(want), `${t.name}: the slicer's inputs cut other bytes than the oracle's`);
      }
    } finally {
      await device.free();
    }
  }
});

test('a rule the slicer cannot follow is refused by tensor name', async () => {
  // 8 ranks over 4 KV heads: each head is held by two ranks, not an even split.
  try {
    await rankPlans(exampleModel, 8);
    assert.unreachable('planned');
  } catch (err) {
    assert.match((err as Error).message, /^model\.layers\.0\.self_attn\.k_proj\.weight: rule .*"kvHeads":4.* is not an even split/);
  }
});

test.run();
