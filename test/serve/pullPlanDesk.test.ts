// A pull plan is made against its model's layout (src/serve/pullPlanDesk.ts): a version written
// by an update keeps its base's layout, so the plan serves it; a checkpoint swapped in that lays
// its tensors out otherwise is refused by what differs. A plan named in parts is bounded per plan
// and across the node, each part checked as it comes, and goes with its connection.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { layoutDifference, PullPlanDesk, type PullPlan } from '../../src/serve/pullPlanDesk.js';
import type { Caller } from '../../src/serve/leaseTable.js';
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

const GPU = 'GPU-00000000-0000-0000-0000-000000000001';
/** A cuda rank with descriptors, of `n` one-byte tensors: parts of plans over it stay in JS (only a plan's last part calls the addon). */
function cudaService(n: number): RankService {
  const tensors = Array.from({ length: n }, (_, i) => t(`w${i}`, 0, i, 1));
  return {
    rank: { name: 'm', globalRank: 0, backend: 'cuda', device: { index: 0, uuid: GPU }, segments: [{ segment: 0, bytes: n, handle: 'cuda-fd', fd: 3 }], tensors },
  } as unknown as RankService;
}
const caller = (connectionId: number) => ({ connectionId, pid: 1000 + connectionId }) as unknown as Caller;
const named = (from: number, to: number) => Array.from({ length: to - from }, (_, k) => ({ name: `w${from + k}`, source: 0, offset: from + k, bytes: 1 }));
const code = async (p: Promise<unknown>) => p.then(() => 'ok', (err: { code?: string }) => err.code);
const connected = () => true;

test('a plan in parts: each part checked as it comes, bounded per plan and across the node, gone with its connection', async () => {
  const desk = new PullPlanDesk({ planTensors: 6, nodeTensors: 10 });
  const service = cudaService(20);
  const first = await desk.open(service, caller(1), GPU, ['h'], named(0, 3), connected, { more: true });
  assert.ok('pending' in first && first.pending.tensors === 3, 'a part with more is kept, not made');
  const id = 'pending' in first ? first.pending.id : '';
  assert.is(await code(desk.open(service, caller(2), GPU, ['h'], named(3, 4), connected, { more: true, plan: id })), 'E_NO_PULL_PLAN', "another connection's plan");
  assert.is(await code(desk.open(service, caller(1), GPU, ['h'], named(2, 4), connected, { more: true, plan: id })), 'E_BAD_REQUEST', 'a tensor an earlier part named');
  assert.is(await code(desk.open(service, caller(1), GPU, ['h'], [{ name: 'nope', source: 0, offset: 0, bytes: 1 }], connected, { more: true, plan: id })), 'E_UNKNOWN_TENSOR');
  assert.is(await code(desk.open(service, caller(1), 'GPU-ffffffff-0000-0000-0000-000000000000', ['h'], named(3, 4), connected, { more: true, plan: id })), 'E_DEVICE_MISMATCH');
  const second = await desk.open(service, caller(1), GPU, ['h2'], named(3, 5), connected, { more: true, plan: id });
  assert.ok('pending' in second && second.pending.tensors === 5 && second.pending.sources === 2, 'the refused parts left the plan as it was; the taken one added to it');
  assert.is(await code(desk.open(service, caller(1), GPU, ['h'], named(5, 7), connected, { more: true, plan: id })), 'E_BAD_REQUEST', 'past the tensors one plan may name');
  await desk.open(service, caller(3), GPU, ['h'], named(10, 14), connected, { more: true });
  assert.is(await code(desk.open(service, caller(4), GPU, ['h'], named(14, 16), connected, { more: true })), 'E_TOO_MANY_PULL_PLANS', "past the tensors the node's plans may name");
  assert.ok(desk.holds(1), 'a connection naming a plan is held open while idle');
  desk.connectionClosed(1);
  desk.connectionClosed(3);
  assert.not.ok(desk.holds(1));
  assert.is(await code(desk.open(service, caller(1), GPU, ['h'], named(5, 6), connected, { more: true, plan: id })), 'E_NO_PULL_PLAN', 'gone with its connection');
  const again = await desk.open(service, caller(4), GPU, ['h'], named(0, 6), connected, { more: true });
  assert.ok('pending' in again, "the closed connections' tensors no longer count against the node's bound");
});

test.run();
