// Which resident models a load that does not fit may evict (docs/operations.md, Eviction). Pure:
// it reads the pools the refused load needs (src/models/modelFit.ts) and the node's models as
// status reports them, and answers with the models to unload or with why none can make room.
//
// no-lease-lru: only a model that serves with no lease on any rank is a candidate (a lease is
// memory a client maps or copies now), least recently used first (its last attach, or when it
// began serving if none attached since). The node's own model is a candidate like any other:
// its kept segments (--keeper) are dropped with its release, so evicting it frees the memory,
// and a restart loads it again as the command line says. An older version of the name being
// loaded is a candidate too: it would drain once the new one serves anyway.
import type { ModelStatus } from '../nodeStatus.js';
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

/** A model chosen to make room, with the bytes it holds in each pool (some perhaps shared with a version that stays). */
export interface Eviction {
  model: ModelStatus;
  bytesByPool: Record<string, number>;
}

/** No choice of candidates makes room: the first pool that stays short even with every candidate evicted. */
export interface EvictionRefusal {
  pool: string;
  neededBytes: number;
  freeBytes: number;
  /** Bytes of that pool held by candidates: all that evicting could add to freeBytes. */
  evictableBytes: number;
  candidates: string[];
}

export type EvictionPlan = { evict: Eviction[] } | { refusal: EvictionRefusal };

/**
 * The memory each of a model's segments is, with its pool and bytes (the fit check counts the
 * same: the tensors' bytes plus their alignment). A segment with no memory identity (cuda
 * legacy IPC), or a rank not yet loaded, is memory of its own: the status object itself names it.
 */
function memoryOf(m: ModelStatus): Array<{ memory: unknown; pool: string; bytes: number }> {
  const out: Array<{ memory: unknown; pool: string; bytes: number }> = [];
  for (const r of m.ranks) {
    if (r.device === undefined || r.state === 'released') continue;
    const pool = poolOf(r.device);
    if (r.segments === undefined) out.push({ memory: r, pool, bytes: r.bytes });
    else for (const s of r.segments) out.push({ memory: s.memory ?? s, pool, bytes: s.bytes });
  }
  return out;
}

/** What a model holds in each pool: its ranks' segments, shared ones included. */
function bytesByPool(m: ModelStatus): Record<string, number> {
  const out: Record<string, number> = {};
  for (const { pool, bytes } of memoryOf(m)) out[pool] = (out[pool] ?? 0) + bytes;
  return out;
}

/**
 * What evicting `chosen` frees in each pool: each segment once, and only one that no model
 * staying holds too (a writer's partial update shares the base's segments between versions,
 * docs/weight-updates.md: evicting one of them frees only what the others do not hold).
 */
function freedByPool(chosen: readonly ModelStatus[], models: readonly ModelStatus[]): Record<string, number> {
  const kept = new Set(models.filter((m) => !chosen.includes(m)).flatMap((m) => memoryOf(m).map((s) => s.memory)));
  const counted = new Set<unknown>();
  const out: Record<string, number> = {};
  for (const s of chosen.flatMap(memoryOf)) {
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
 * The fewest least recently used candidates that cover every short pool of `pools`: candidates
 * are taken oldest first while a pool they draw on is short, then any taken one the others
 * already cover is given back (the most recently used first). Nothing when no pool is short.
 */
export function planEviction(pools: readonly PoolNeed[], models: readonly ModelStatus[]): EvictionPlan {
  const short = pools.filter((p) => p.neededBytes > p.freeBytes);
  const candidates = models
    .filter(isCandidate)
    .map((model) => ({ model, bytesByPool: bytesByPool(model) }))
    // Stable: equal times keep status order (the node's own model, then by load).
    .sort((a, b) => (a.model.lastUsedAt ?? 0) - (b.model.lastUsedAt ?? 0));
  const freed = (chosen: readonly Eviction[], pool: string) => freedByPool(chosen.map((e) => e.model), models)[pool] ?? 0;
  const stillShort = (p: PoolNeed, chosen: readonly Eviction[]) => p.freeBytes + freed(chosen, p.pool) < p.neededBytes;
  const chosen: Eviction[] = [];
  for (const c of candidates) {
    if (short.every((p) => !stillShort(p, chosen))) break;
    // Taken if it holds memory in a pool still short, shared or not: what it shares is freed
    // once every version holding it is taken, and the pass below gives back what is not needed.
    if (short.some((p) => stillShort(p, chosen) && (c.bytesByPool[p.pool] ?? 0) > 0)) chosen.push(c);
  }
  const p = short.find((s) => stillShort(s, chosen));
  if (p) {
    return {
      refusal: {
        pool: p.pool,
        neededBytes: p.neededBytes,
        freeBytes: p.freeBytes,
        evictableBytes: freed(candidates, p.pool),
        candidates: candidates.map((c) => c.model.name),
      },
    };
  }
  for (let i = chosen.length - 1; i >= 0; i--) {
    const without = chosen.filter((_, j) => j !== i);
    if (short.every((s) => !stillShort(s, without))) chosen.splice(i, 1);
  }
  return { evict: chosen };
}
