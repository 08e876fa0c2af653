// The packed form of what a fill copies: copy ops and zero ranges (and a cuda commit's copies) as flat Float64Arrays of
// records, which the addon reads without a property lookup per op (a plan has 100k ops). The
// field orders below are the TypeScript half of native/fill_records.h; test/native/fillRecords
// round-trips records through a host fill, so the halves cannot disagree unnoticed.
import type { CopyOp, TensorRange, ZeroRange } from '../checkpoint/types.js';

declare const packed: unique symbol;
/** Copy ops packed by packCopyOps: COPY_OP_FIELDS.length numbers per op. */
export type PackedCopyOps = Float64Array & { readonly [packed]: 'CopyOps' };
/** Zero ranges packed by packZeroRanges: ZERO_RANGE_FIELDS.length numbers per range. */
export type PackedZeroRanges = Float64Array & { readonly [packed]: 'ZeroRanges' };
/** Tensor ranges packed by packTensorRanges: TENSOR_RANGE_FIELDS.length numbers per range. */
export type PackedTensorRanges = Float64Array & { readonly [packed]: 'TensorRanges' };
/** Commit copies packed by packCommitCopies: COMMIT_COPY_FIELDS.length numbers per copy. */
export type PackedCommitCopies = Float64Array & { readonly [packed]: 'CommitCopies' };

/**
 * One device-to-device copy of a cuda commit (native/fill_records.h CommitCopy): `bytes` from
 * `srcOffset` of source `source` to `dstOffset` of segment `segment`'s final allocation. Source 0
 * is the segment's own descriptor (under a pull, the base's segment); k > 0, the k-th pulled handle.
 */
export interface CommitCopy {
  segment: number;
  source: number;
  srcOffset: number;
  dstOffset: number;
  bytes: number;
}

/** A record's field order: every field of T exactly where the native reading expects it; a field of T left out does not compile. */
function fieldOrder<T>() {
  return <const F extends readonly (keyof T)[]>(fields: F & ([Exclude<keyof T, F[number]>] extends [never] ? unknown : { missing: Exclude<keyof T, F[number]> })): F => fields;
}

export const COPY_OP_FIELDS = fieldOrder<CopyOp>()(['file', 'segment', 'srcOffset', 'dstOffset', 'rows', 'rowBytes', 'srcPitch']);
export const ZERO_RANGE_FIELDS = fieldOrder<ZeroRange>()(['segment', 'offset', 'bytes']);
export const TENSOR_RANGE_FIELDS = fieldOrder<TensorRange>()(['file', 'start', 'end']);
export const COMMIT_COPY_FIELDS = fieldOrder<CommitCopy>()(['segment', 'source', 'srcOffset', 'dstOffset', 'bytes']);

function pack<T>(fields: readonly (keyof T)[], records: readonly T[]): Float64Array {
  const out = new Float64Array(records.length * fields.length);
  let at = 0;
  for (const r of records) for (const f of fields) out[at++] = r[f] as number;
  return out;
}

export function packCopyOps(ops: readonly CopyOp[]): PackedCopyOps {
  return pack(COPY_OP_FIELDS, ops) as PackedCopyOps;
}

export function packZeroRanges(ranges: readonly ZeroRange[]): PackedZeroRanges {
  return pack(ZERO_RANGE_FIELDS, ranges) as PackedZeroRanges;
}

export function packTensorRanges(ranges: readonly TensorRange[]): PackedTensorRanges {
  return pack(TENSOR_RANGE_FIELDS, ranges) as PackedTensorRanges;
}

export function packCommitCopies(copies: readonly CommitCopy[]): PackedCommitCopies {
  return pack(COMMIT_COPY_FIELDS, copies) as PackedCommitCopies;
}
