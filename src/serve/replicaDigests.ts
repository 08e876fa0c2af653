// Which ranks of a version hold the same piece of a tensor, and so must hold the same bytes: a
// replicated tensor on every rank, and a key/value projection whose heads are fewer than the
// ranks on each run of tp / kvHeads ranks (ShardRule, src/checkpoint/types.ts). A version read
// from a checkpoint holds them alike by construction; a written one holds what each rank's writer
// wrote, and an engine whose ranks ran different copies of one replicated weight would compute
// something no checkpoint holds. The update's commit compares their digests (updateDesk.ts).
// Not covered: a fused tensor whose key/value parts are shared by ranks while its query part is
// not (Phi-3's qkv_proj at tp > kvHeads): its pieces differ as wholes, and the commit has one
// digest a piece, not one a part.
import type { ShardRule } from '../checkpoint/types.js';

/** The piece of a tensor with `rule` that `rank` of `tp` holds, named so that ranks holding the same piece get the same name; undefined when no other rank holds it. */
export function replicaPiece(rule: ShardRule | undefined, rank: number, tp: number): string | undefined {
  if (tp < 2 || rule === undefined) return undefined;
  if (rule.kind === 'replicated') return 'whole';
  if (rule.kind === 'split' && rule.kvHeads !== undefined && tp > rule.kvHeads) return `head ${Math.floor(rank / (tp / rule.kvHeads))}`;
  return undefined;
}

export interface RankDigests {
  globalRank: number;
  tp: number;
  tensors: readonly { name: string; rule?: ShardRule }[];
  /** Per tensor of `tensors`, in order. */
  digests: readonly string[];
}

/** Each tensor piece that two ranks hold with different digests: its name, the piece, and the first two ranks that differ. */
export function replicaMismatches(ranks: readonly RankDigests[]): { name: string; piece: string; ranks: [number, number] }[] {
  // One rank shares no piece with another: nothing to compare (a walk over every tensor, 1 ms of a commit at 50k tensors).
  if (ranks.length < 2) return [];
  const first = new Map<string, { rank: number; digest: string }>();
  const out: { name: string; piece: string; ranks: [number, number] }[] = [];
  const reported = new Set<string>();
  for (const r of [...ranks].sort((a, b) => a.globalRank - b.globalRank)) {
    r.tensors.forEach((t, i) => {
      const piece = replicaPiece(t.rule, r.globalRank, r.tp);
      if (piece === undefined) return;
      const key = `${t.name}\u0000${piece}`;
      const seen = first.get(key);
      if (!seen) first.set(key, { rank: r.globalRank, digest: r.digests[i]! });
      else if (seen.digest !== r.digests[i] && !reported.has(key)) {
        reported.add(key);
        out.push({ name: t.name, piece, ranks: [seen.rank, r.globalRank] });
      }
    });
  }
  return out;
}
