// Which of a rank's tensors' digests its fill computed already (issue 31): the fill digests the
// checkpoint's tensors as its files hold them (ContentTensors), while a writer's commit digests the
// rank's own tensors as its arena holds them. Where a contiguous copy op wrote a checkpoint tensor's
// whole range into the arena, the rank tensor of exactly those arena bytes is the same bytes, so
// has the same digest: a commit that shares its segment with its base reuses it instead of reading
// the bytes again.
import type { RankPlan } from './types.js';

/**
 * Per tensor of `rank.tensors`, the digest of its bytes in the arena where `contentDigests`
 * (the fill's, in contentTensors' order) proves it, else undefined (a shard, a strided or padded copy).
 */
export function arenaTensorDigests(rank: Pick<RankPlan, 'tensors' | 'ops' | 'contentTensors'>, contentDigests: readonly string[]): (string | undefined)[] {
  // Each file's checkpoint tensors by start, to find those an op's source range holds.
  const byFile = new Map<number, number[]>();
  // Pushed, not copied: a copy per tensor made this quadratic, 1.1 s and 2 s of GC at 50,438
  // tensors between a rank's fill and its serving (bench/RESULTS.md, issue 33).
  for (const [i, r] of rank.contentTensors.ranges.entries()) {
    const list = byFile.get(r.file);
    if (list) list.push(i);
    else byFile.set(r.file, [i]);
  }
  for (const list of byFile.values()) list.sort((a, b) => rank.contentTensors.ranges[a]!.start - rank.contentTensors.ranges[b]!.start);
  const inArena = new Map<string, string | undefined>();
  for (const op of rank.ops) {
    // Only a contiguous copy keeps a tensor's bytes together (one row, or rows back to back in the file).
    if (op.rows !== 1 && op.srcPitch !== op.rowBytes) continue;
    const end = op.srcOffset + op.rows * op.rowBytes;
    const list = byFile.get(op.file) ?? [];
    for (let k = firstAtOrAfter(list, op.srcOffset, rank.contentTensors.ranges); k < list.length; k++) {
      const r = rank.contentTensors.ranges[list[k]!]!;
      if (r.end > end) break;
      inArena.set(`${op.segment}:${op.dstOffset + (r.start - op.srcOffset)}:${r.end - r.start}`, contentDigests[list[k]!]);
    }
  }
  return rank.tensors.map((t) => inArena.get(`${t.segment}:${t.offset}:${t.bytes}`));
}

/** The first position of `list` (indices of `ranges`, sorted by start) whose range starts at or after `at`. */
function firstAtOrAfter(list: readonly number[], at: number, ranges: RankPlan['contentTensors']['ranges']): number {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[list[mid]!]!.start < at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
