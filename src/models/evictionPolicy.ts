// Which resident models a load that does not fit may evict (docs/operations.md, Eviction). Pure:
// it reads the pools the refused load needs (src/models/modelFit.ts) and the node's models as
// status reports them, and answers with the processed layouts to drop and the models to unload,
// or with why none can make room.
//
// no-lease-lru: processed layouts no engine maps go first, least recently mapped first: they are
// derived from a version that stays (docs/engines.md, "Publishing what the engine computed"), so
// dropping one costs the next engine start with its key one processing, and no client loses a
// byte it reads now (an engine that maps one holds a lease on it; a leased one frees nothing
// when the daemon closes it). Evicting a model costs every client of it a disk load. Then, when
// that is not enough, only a model that serves with no lease on any rank is a candidate (a lease
// is memory a client maps or copies now), least recently used first (its last attach, or when it
// began serving if none attached since); its release frees its processed layouts with it. The
// node's own model is a candidate like any other: its kept segments (--keeper) are dropped with
// its release, so evicting it frees the memory, and a restart loads it again as the command line
// says. An older version of the name being loaded is a candidate too: it would drain once the new
// one serves anyway.
import type { ModelStatus } from '../nodeStatus.js';
import type { ProcessedLayoutStatus } from '../wire/protocol.js';
import { poolOf, type PoolNeed } from './modelFit.js';
import { usage } from '../flagValues.js';

export const EVICTION_POLICIES = ['off', 'no-lease-lru'] as const;
export type EvictionPolicy = (typeof EVICTION_POLICIES)[number];

/** Validates a policy from `flag` (--evict, or ctl load --evict). */
export function checkEvictionPolicy(flag: string, value: unknown): EvictionPolicy {
  if (!(EVICTION_POLICIES as readonly unknown[]).includes(value)) {
    throw usage(flag, value, 'is not an eviction policy', `use ${EVICTION_POLICIES.join(' or ')} (docs/operations.md, Eviction)`);
  }
  return value as EvictionPolicy;
}

/** A model chosen to make room, with the bytes it holds in each pool, its processed layouts included (some perhaps shared with a version that stays). */
export interface Eviction {
  model: ModelStatus;
  bytesByPool: Record<string, number>;
}

/** A processed layout chosen to be dropped to make room, beside a rank of `model` on device `deviceUuid`, in `pool`. */
export interface ProcessedDrop {
  model: ModelStatus;
  deviceUuid: string;
  pool: string;
  layout: ProcessedLayoutStatus;
}

/** No choice of candidates makes room: the first pool that stays short even with every candidate evicted. */
export interface EvictionRefusal {
  pool: string;
  neededBytes: number;
  freeBytes: number;
  /** Bytes of that pool held by candidates and by processed layouts no engine maps: all that evicting could add to freeBytes. */
  evictableBytes: number;
  candidates: string[];
}

export type EvictionPlan = { drop: ProcessedDrop[]; evict: Eviction[] } | { refusal: EvictionRefusal };

/**
 * The memory each of a model's segments and processed layouts is, with its pool and bytes (the
 * fit check counts the same: the tensors' bytes plus their alignment). A segment with no memory
 * identity (cuda legacy IPC), a rank not yet loaded, and a processed layout are memory of their
 * own: the status object itself names it.
 */
function memoryOf(m: ModelStatus): Array<{ memory: unknown; pool: string; bytes: number }> {
  const out: Array<{ memory: unknown; pool: string; bytes: number }> = [];
  for (const r of m.ranks) {
    if (r.device === undefined || r.state === 'released') continue;
    const pool = poolOf(r.device);
    if (r.segments === undefined) out.push({ memory: r, pool, bytes: r.bytes });
    else for (const s of r.segments) out.push({ memory: s.memory ?? s, pool, bytes: s.bytes });
    for (const p of r.processed ?? []) out.push({ memory: p, pool, bytes: p.bytes });
  }
  return out;
}

/** The processed layouts no engine maps, of versions that serve or drain: dropping one frees its bytes. */
function droppable(models: readonly ModelStatus[]): ProcessedDrop[] {
  return models
    .filter((m) => m.state === 'serving' || m.state === 'draining')
    .flatMap((model) =>
      model.ranks.flatMap((r) =>
        r.device === undefined || r.state === 'released' ? [] : (r.processed ?? []).filter((p) => p.leases === 0).map((layout) => ({ model, deviceUuid: r.device!.uuid, pool: poolOf(r.device!), layout })),
      ),
    );
}

/** What a model holds in each pool: its ranks' segments, shared ones included, and its processed layouts. */
function bytesByPool(m: ModelStatus): Record<string, number> {
  const out: Record<string, number> = {};
  for (const { pool, bytes } of memoryOf(m)) out[pool] = (out[pool] ?? 0) + bytes;
  return out;
}

/**
 * What dropping `dropped` and evicting `chosen` frees in each pool: each segment or layout once,
 * and only one that no model staying holds too (a writer's partial update shares the base's
 * segments between versions, docs/weight-updates.md: evicting one of them frees only what the
 * others do not hold).
 */
function freedByPool(chosen: readonly ModelStatus[], dropped: readonly ProcessedDrop[], models: readonly ModelStatus[]): Record<string, number> {
  const gone = new Set<unknown>(dropped.map((d) => d.layout));
  const kept = new Set(models.filter((m) => !chosen.includes(m)).flatMap((m) => memoryOf(m).map((s) => s.memory)).filter((memory) => !gone.has(memory)));
  const counted = new Set<unknown>();
  const out: Record<string, number> = {};
  for (const s of [...dropped.map((d) => ({ memory: d.layout, pool: d.pool, bytes: d.layout.bytes })), ...chosen.flatMap(memoryOf)]) {
    if (kept.has(s.memory) || counted.has(s.memory)) continue;
    counted.add(s.memory);
    out[s.pool] = (out[s.pool] ?? 0) + s.bytes;
  }
  return out;
}

function isCandidate(m: ModelStatus): boolean {
  return m.state === 'serving' && m.leases === 0 && m.ranks.every((r) => r.leases === 0);
}

/**
 * What makes room for every short pool of `pools`, at the least cost: processed layouts no engine
 * maps, least recently mapped (or published) first, while a pool they are in is short; then, when
 * even all of those leave a pool short, the fewest least recently used candidate models, taken
 * oldest first while a pool they draw on is short. Then any model taken that the others already
 * cover is given back (the most recently used first), and any layout so too. Nothing when no pool
 * is short.
 */
export function planEviction(pools: readonly PoolNeed[], models: readonly ModelStatus[]): EvictionPlan {
  const short = pools.filter((p) => p.neededBytes > p.freeBytes);
  const layouts = droppable(models).sort((a, b) => (a.layout.lastMappedAt ?? a.layout.publishedAt) - (b.layout.lastMappedAt ?? b.layout.publishedAt));
  const candidates = models
    .filter(isCandidate)
    .map((model) => ({ model, bytesByPool: bytesByPool(model) }))
    // Stable: equal times keep status order (the node's own model, then by load).
    .sort((a, b) => (a.model.lastUsedAt ?? 0) - (b.model.lastUsedAt ?? 0));
  const freed = (chosen: readonly Eviction[], dropped: readonly ProcessedDrop[], pool: string) => freedByPool(chosen.map((e) => e.model), dropped, models)[pool] ?? 0;
  const stillShort = (p: PoolNeed, chosen: readonly Eviction[], dropped: readonly ProcessedDrop[]) => p.freeBytes + freed(chosen, dropped, p.pool) < p.neededBytes;
  const covered = (chosen: readonly Eviction[], dropped: readonly ProcessedDrop[]) => short.every((p) => !stillShort(p, chosen, dropped));
  const dropped: ProcessedDrop[] = [];
  for (const l of layouts) {
    if (covered([], dropped)) break;
    if (short.some((p) => p.pool === l.pool && stillShort(p, [], dropped))) dropped.push(l);
  }
  const chosen: Eviction[] = [];
  for (const c of candidates) {
    if (covered(chosen, dropped)) break;
    // Taken if it holds memory in a pool still short, shared or not: what it shares is freed
    // once every version holding it is taken, and the pass below gives back what is not needed.
    if (short.some((p) => stillShort(p, chosen, dropped) && (c.bytesByPool[p.pool] ?? 0) > 0)) chosen.push(c);
  }
  const p = short.find((s) => stillShort(s, chosen, dropped));
  if (p) {
    return {
      refusal: {
        pool: p.pool,
        neededBytes: p.neededBytes,
        freeBytes: p.freeBytes,
        evictableBytes: freed(candidates, layouts, p.pool),
        candidates: candidates.map((c) => c.model.name),
      },
    };
  }
  for (let i = chosen.length - 1; i >= 0; i--) {
    const without = chosen.filter((_, j) => j !== i);
    if (covered(without, dropped)) chosen.splice(i, 1);
  }
  // A layout of an evicted model goes with it: not dropped on its own.
  const kept = dropped.filter((d) => !chosen.some((e) => e.model === d.model));
  for (let i = kept.length - 1; i >= 0; i--) {
    const without = kept.filter((_, j) => j !== i);
    if (covered(chosen, without)) kept.splice(i, 1);
  }
  return { drop: kept, evict: chosen };
}
