// A pull plan is made against its model's layout (src/serve/pullPlanDesk.ts): a version written
// by an update keeps its base's layout, so the plan serves it; a checkpoint swapped in that lays
// its tensors out otherwise is refused by what differs.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { layoutDifference, type PullPlan } from '../../src/serve/pullPlanDesk.js';
import type { RankService } from '../../src/serve/rankService.js';

const t = (name: string, segment: number, offset: number, bytes: number) => ({ name, dtype: 'U8', shape: [bytes], segment, offset, bytes });
const base = [t('a', 0, 0, 100), t('b', 0, 128, 100), t('d', 1, 0, 32)];

function rank(tensors = base.map((x) => ({ ...x })), segments = [256, 64]): RankService['rank'] {
  return { name: 'm', segments: segments.map((bytes, segment) => ({ segment, bytes })), tensors } as unknown as RankService['rank'];
}

const plan = { layout: base, segmentBytes: [256, 64] } as unknown as PullPlan;

test("another version's copy of the same layout fits the plan", () => {
  assert.is(layoutDifference(plan, rank()), undefined);
});

test('a layout that moved, resized, dropped or added a tensor, or resized a segment, is named', () => {
  assert.is(layoutDifference(plan, rank([t('a', 0, 0, 100), t('b', 0, 120, 100), t('d', 1, 0, 32)])), 'tensor "b" lies elsewhere');
  assert.is(layoutDifference(plan, rank([t('a', 0, 0, 96), t('b', 0, 128, 100), t('d', 1, 0, 32)])), 'tensor "a" lies elsewhere');
  assert.is(layoutDifference(plan, rank([t('a', 0, 0, 100), t('b', 0, 128, 100)])), 'tensor "d" is gone');
  assert.is(layoutDifference(plan, rank([...base, t('e', 1, 32, 32)])), 'it holds other tensors');
  assert.is(layoutDifference(plan, rank(base, [256, 128])), 'its segments differ');
});

test.run();
