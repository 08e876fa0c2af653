// The no-lease-lru choice (src/models/evictionPolicy.ts) on its own: candidates, order, per-pool
// shortfalls on several GPUs, the fewest victims, the refusal when no choice makes room, and
// segments that versions share (a writer's partial update) counted once; processed layouts no
// engine maps dropped before any model, and counted with the model that holds them.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { checkEvictionPolicy, planEviction, type EvictionPlan } from '../../src/models/evictionPolicy.js';
import type { ModelStatus, ServedRankStatus } from '../../src/nodeStatus.js';
import { UsageError } from '../../src/errors.js';

const gpu = (uuid: string) => ({ backend: 'cuda' as const, index: 0, uuid, name: 'gpu', totalBytes: 100, freeBytes: 0 });

/** A serving model with `bytes` on each GPU named, last used at `usedAt`. */
function model(name: string, usedAt: number, placement: Record<string, number>, o: { leases?: number; own?: boolean; state?: ModelStatus['state'] } = {}): ModelStatus {
  const ranks: ServedRankStatus[] = Object.entries(placement).map(([uuid, bytes], i) => ({
    localRank: i,
    globalRank: i,
    state: 'serving',
    device: gpu(uuid),
    bytes,
    totalBytes: bytes,
    seconds: 0,
    segments: [{ segment: 0, bytes, handle: 'cuda-fd' } as never],
    leases: i === 0 ? (o.leases ?? 0) : 0,
  }));
  return { name, own: o.own ?? false, state: o.state ?? 'serving', model: `/m/${name}`, fingerprint: `fp-${name}`, tpSize: ranks.length, version: 0, current: true, bytes: 0, processedBytes: 0, leases: o.leases ?? 0, lastUsedAt: usedAt, ranks };
}

const names = (plan: EvictionPlan) => ('evict' in plan ? plan.evict.map((e) => e.model.name) : plan);

test('the least recently used candidate that covers the shortfall, and no more', () => {
  const models = [model('own', 30, { g0: 40 }, { own: true }), model('old', 10, { g0: 40 }), model('mid', 20, { g0: 40 })];
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 50, freeBytes: 20 }], models)), ['old']);
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 90, freeBytes: 20 }], models)), ['old', 'mid']);
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 130, freeBytes: 20 }], models)), ['old', 'mid', 'own'], 'the own model is a candidate too');
});

test('only models that serve with no lease are candidates', () => {
  const models = [model('leased', 1, { g0: 100 }, { leases: 1 }), model('draining', 2, { g0: 100 }, { state: 'draining' }), model('free', 3, { g0: 100 })];
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 50, freeBytes: 0 }], models)), ['free']);
});

test('each short pool is covered; a model on no short pool is left alone; a victim the later ones cover is given back', () => {
  const models = [model('g1only', 1, { g1: 100 }), model('small0', 2, { g0: 10 }), model('both', 3, { g0: 60, g2: 60 })];
  const pools = [
    { pool: 'g0', neededBytes: 50, freeBytes: 0 },
    { pool: 'g1', neededBytes: 10, freeBytes: 50 },
    { pool: 'g2', neededBytes: 50, freeBytes: 0 },
  ];
  assert.equal(names(planEviction(pools, models)), ['both'], 'g1 is not short; small0 helps but both alone covers g0 and g2');
});

test('no pool short: nothing to evict', () => {
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 10, freeBytes: 10 }], [model('a', 1, { g0: 10 })])), []);
});

test('no choice makes room: a refusal naming the first pool that stays short and what its candidates hold', () => {
  const models = [model('a', 1, { g0: 30, g1: 100 }), model('leased', 2, { g0: 500 }, { leases: 2 })];
  const plan = planEviction([{ pool: 'g1', neededBytes: 50, freeBytes: 0 }, { pool: 'g0', neededBytes: 100, freeBytes: 50 }], models);
  assert.equal(plan, { refusal: { pool: 'g0', neededBytes: 100, freeBytes: 50, evictableBytes: 30, candidates: ['a'] } });
});

test('a policy that is not one is refused with the ones there are', () => {
  assert.is(checkEvictionPolicy('--evict', 'no-lease-lru'), 'no-lease-lru');
  assert.throws(() => checkEvictionPolicy('--evict', 'lru'), (e: Error) => e instanceof UsageError && /--evict "lru": is not an eviction policy; use off or no-lease-lru/.test(e.message));
});

/** A model on one pool whose segments are the memory named, with those bytes. */
function sharing(name: string, usedAt: number, segments: Array<[memory: string, bytes: number]>, o: { leases?: number } = {}): ModelStatus {
  const m = model(name, usedAt, { g0: segments.reduce((n, [, b]) => n + b, 0) }, o);
  m.ranks[0]!.segments = segments.map(([memory, bytes], segment) => ({ segment, bytes, handle: 'memfd', memory }));
  return m;
}

test('memory that versions share counts once, and is freed only when every version holding it goes', () => {
  const v0 = sharing('v0', 1, [['a', 40], ['b', 10]]);
  const v1 = sharing('v1', 2, [['a', 40], ['c', 10]]);
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 15, freeBytes: 5 }], [v0, v1])), ['v0'], 'v0 alone frees b');
  assert.equal(names(planEviction([{ pool: 'g0', neededBytes: 30, freeBytes: 5 }], [v0, v1])), ['v0', 'v1'], 'a goes only with both');
  assert.equal(planEviction([{ pool: 'g0', neededBytes: 100, freeBytes: 0 }], [v0, v1]), { refusal: { pool: 'g0', neededBytes: 100, freeBytes: 0, evictableBytes: 60, candidates: ['v0', 'v1'] } });
  const leased = sharing('v1', 2, [['a', 40], ['c', 10]], { leases: 1 });
  assert.equal(planEviction([{ pool: 'g0', neededBytes: 30, freeBytes: 0 }], [v0, leased]), { refusal: { pool: 'g0', neededBytes: 30, freeBytes: 0, evictableBytes: 10, candidates: ['v0'] } }, 'what a leased version shares stays');
});

/** `m` with processed layouts beside its first rank: [key, bytes, leases, last used]. */
function withLayouts(m: ModelStatus, layouts: Array<[key: string, bytes: number, leases: number, usedAt: number]>): ModelStatus {
  m.ranks[0]!.processed = layouts.map(([key, bytes, leases, usedAt]) => ({ key, base: `rfp-${m.name}`, bytes, leases, publishedAt: usedAt }));
  m.processedBytes = layouts.reduce((n, [, b]) => n + b, 0);
  return m;
}

const plan = (p: EvictionPlan) => ('evict' in p ? { drop: p.drop.map((d) => `${d.model.name}/${d.layout.key}`), evict: p.evict.map((e) => e.model.name) } : p);

test('processed layouts no engine maps go first, least recently mapped first, just enough; a leased one stays; a leased model\'s unleased layout may go', () => {
  const models = [withLayouts(model('own', 30, { g0: 40 }, { own: true, leases: 1 }), [['p-old', 10, 0, 1], ['p-mapped', 50, 1, 0], ['p-new', 10, 0, 5]]), model('free', 10, { g0: 40 })];
  assert.equal(plan(planEviction([{ pool: 'g0', neededBytes: 25, freeBytes: 20 }], models)), { drop: ['own/p-old'], evict: [] });
  assert.equal(plan(planEviction([{ pool: 'g0', neededBytes: 35, freeBytes: 20 }], models)), { drop: ['own/p-old', 'own/p-new'], evict: [] });
  assert.equal(plan(planEviction([{ pool: 'g0', neededBytes: 45, freeBytes: 20 }], models)), { drop: [], evict: ['free'] }, 'a model must go: the layouts it covers stay');
  assert.equal(plan(planEviction([{ pool: 'g0', neededBytes: 65, freeBytes: 20 }], models)), { drop: ['own/p-old'], evict: ['free'] });
  const p = planEviction([{ pool: 'g0', neededBytes: 200, freeBytes: 20 }], models);
  assert.equal(p, { refusal: { pool: 'g0', neededBytes: 200, freeBytes: 20, evictableBytes: 60, candidates: ['free'] } }, 'the mapped layout and the leased model count for nothing');
});

test("an evicted model's processed layouts are freed with it and count towards the room it makes", () => {
  const models = [withLayouts(model('a', 1, { g0: 40 }), [['pa', 30, 0, 1]]), model('b', 2, { g0: 60 })];
  assert.equal(plan(planEviction([{ pool: 'g0', neededBytes: 70, freeBytes: 0 }], models)), { drop: [], evict: ['a'] }, "a's 40 bytes and its 30-byte layout cover 70");
  assert.equal(plan(planEviction([{ pool: 'g0', neededBytes: 30, freeBytes: 0 }], models)), { drop: ['a/pa'], evict: [] });
});

test.run();
