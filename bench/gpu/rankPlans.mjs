// The daemon's own load plans (src/checkpoint, compiled in dist/), in the shape the GPU
// benchmarks and checks use: per rank its files, copy ops and arena size, and per tensor what
// an independent slicer (test/gpu/expected-slices.py: numpy's array_split of the tensor read
// from its file) needs to compute the rank's bytes: file path, data range, full shape, dtype,
// split dim, tp, rank and where the plan puts it. The slicer knows even splits only, so a plan
// with any other rule (fused parts, padded vocab, KV heads replicated) is refused by name.
import { parseSafetensors, planCheckpoint } from '../../dist/src/checkpoint/index.js';

/** The split dim the slicer applies for `rule` (null: replicated), or why it cannot. */
function sliceDim(rule, fullShape, tp) {
  if (!rule || rule.kind === 'replicated') return null;
  if (rule.kind === 'split' && (rule.kvHeads === undefined || tp <= rule.kvHeads) && (rule.padTo === undefined || fullShape[0] % rule.padTo === 0)) return rule.dim;
  throw new Error(`rule ${JSON.stringify(rule)} is not an even split; the GPU check's slicer covers even splits and replicated tensors only`);
}

/**
 * Every rank of `dir` at tensor-parallel size `tp`:
 * [{ files, ops, segmentBytes, payloadBytes, tensors: [{ name, path, begin, end, shape, dtype, dim, tp, rank, offset, bytes }] }].
 */
export async function rankPlans(dir, tp) {
  const plan = await planCheckpoint(dir, { tpSize: tp });
  const files = plan.ranks[0].files;
  const sources = new Map();
  for (const header of await Promise.all(files.map((p) => parseSafetensors(p)))) {
    for (const t of header.tensors) sources.set(t.name, { ...t, path: header.path });
  }
  return plan.ranks.map((r) => {
    if (r.segments.length !== 1) throw new Error(`rank ${r.tpRank} has ${r.segments.length} segments; the GPU check compares one`);
    const tensors = r.tensors.map((t) => {
      const s = sources.get(t.name);
      let dim;
      try {
        dim = sliceDim(t.rule, s.shape, tp);
      } catch (err) {
        throw new Error(`${t.name}: ${err.message}`);
      }
      return { name: t.name, path: s.path, begin: s.begin, end: s.end, shape: s.shape, dtype: t.dtype, dim, tp, rank: r.tpRank, offset: t.offset, bytes: t.bytes };
    });
    return { files: r.files, ops: r.ops, segmentBytes: r.segments[0], payloadBytes: r.totalBytes, tensors, tensorRanges: r.contentTensors.ranges };
  });
}
