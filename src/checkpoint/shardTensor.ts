// Turns (tensor, rule, tp rank) into the piece a rank holds and the file regions that make it
// up, in the piece's own row-major order. A split on dim d views the tensor as a 2D
// [prod(shape[:d]), shape[d] * prod(shape[d+1:])] matrix: dim 0 splits are one contiguous byte
// range, later dims are one strided region (rows of a slice, a fixed pitch apart), which the
// copy engine moves with a single 2D copy instead of gathering on the CPU.
//
// The work is split in two: layoutShard validates and computes everything that is the same for
// every rank (once per tensor, at plan time, so errors surface before any rank is laid out),
// and shardRegions places one rank's piece (cheap: it runs tp times per tensor).

import { ShardingError } from '../errors.js';
import { bytesForElements, type SafetensorsDtype } from './dtypes.js';
import type { ShardRule } from './types.js';

export interface ShardSource {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** Absolute file offset of the tensor's first byte. */
  begin: number;
}

/** rows x rowBytes read `srcPitch` apart from srcOffset, written densely in order. */
export interface SourceRegion {
  srcOffset: number;
  rows: number;
  rowBytes: number;
  srcPitch: number;
}

interface PartLayout {
  /** Byte offset of the part's first piece within a row. */
  base: number;
  /** Bytes of one piece within a row. */
  pieceBytes: number;
  /** Consecutive ranks that hold the same piece (> 1 only for replicated KV heads). */
  replicas: number;
}

/** Everything about a tensor's division that does not depend on the rank. */
export interface ShardLayout {
  /** Shape of every rank's piece (all pieces have the same shape). Shared by all ranks: read-only. */
  shape: number[];
  /** Bytes of every rank's piece. */
  bytes: number;
  /** Rows of the 2D view, and the bytes between their starts in the file. */
  outer: number;
  rowPitch: number;
  /** null: every rank holds the whole tensor. */
  parts: PartLayout[] | null;
  /** Set for a padded vocab split (rule.padTo): `shape`/`bytes` are then the padded part's. */
  vocab?: { rows: number; perRank: number; rowBytes: number };
}

/** One rank's piece: its shape, its file regions, and the zero rows that pad it to the part. */
export interface ShardPiece {
  shape: number[];
  /** Bytes read from the file. */
  bytes: number;
  /** Zero bytes after them that complete a padded vocab part (0 otherwise). */
  padBytes: number;
  regions: SourceRegion[];
}

const product = (dims: number[], from = 0, to = dims.length): number => {
  let p = 1;
  for (let i = from; i < to; i++) p *= dims[i]!;
  return p;
};

/**
 * How many distinct pieces a part of `size` is cut into. KV heads fewer than tp follow vLLM's
 * QKVParallelLinear: one head per rank, head r / (tp / kvHeads), so consecutive ranks share a
 * head and each rank's attention stays local; tp must then be a multiple of kvHeads.
 */
function piecesOf(t: ShardSource, dim: number, size: number, kvHeads: number, tpSize: number): number {
  let pieces = tpSize;
  if (kvHeads > 0) {
    if (tpSize > kvHeads) {
      if (tpSize % kvHeads !== 0) {
        throw new ShardingError('E_SHARD_KV_HEADS', `tensor "${t.name}": ${kvHeads} KV heads cannot be replicated evenly over tp size ${tpSize}; use a tp size that is a multiple of ${kvHeads}`, { tensor: t.name, kvHeads, tpSize });
      }
      pieces = kvHeads;
    } else if (kvHeads % tpSize !== 0) {
      throw new ShardingError('E_SHARD_KV_HEADS', `tensor "${t.name}": ${kvHeads} KV heads are not divisible by tp size ${tpSize}; use a tp size that divides ${kvHeads}`, { tensor: t.name, kvHeads, tpSize });
    }
    if (size % kvHeads !== 0) {
      throw new ShardingError('E_SHARD_KV_HEADS', `tensor "${t.name}": dim ${dim} of size ${size} is not a whole number of its ${kvHeads} KV heads; config.json does not match the checkpoint`, { tensor: t.name, dim, size, kvHeads });
    }
  }
  if (size % pieces !== 0) {
    throw new ShardingError('E_SHARD_INDIVISIBLE', `tensor "${t.name}": dim ${dim} of size ${size} is not divisible by tp size ${tpSize}${pieces !== tpSize ? ` (${pieces} pieces)` : ''}; use a tp size that divides ${size}, or a plan file that replicates this tensor`, { tensor: t.name, dim, size, tpSize });
  }
  return pieces;
}

export function layoutShard(t: ShardSource, rule: ShardRule, tpSize: number): ShardLayout {
  const bytesOf = (elements: number, what: string, dim: number): number => {
    const bytes = bytesForElements(t.dtype, elements);
    if (bytes === null) {
      throw new ShardingError('E_SHARD_SUBBYTE', `tensor "${t.name}": ${what} of ${elements} ${t.dtype} elements along dim ${dim} does not end on a byte boundary, so it cannot be copied as bytes; use a tp size that keeps slices byte-aligned, or replicate it`, { tensor: t.name, dim, tpSize });
    }
    return bytes;
  };
  const wholeBytes = bytesOf(product(t.shape), 'the tensor', 0);
  if (rule.kind === 'replicated') return { shape: t.shape, bytes: wholeBytes, outer: 1, rowPitch: wholeBytes, parts: null };

  const { dim } = rule;
  if (rule.kind === 'split' && rule.padTo !== undefined) return layoutPaddedVocab(t, rule.padTo, dim, tpSize, bytesOf);
  if (!Number.isInteger(dim) || dim < 0 || dim >= t.shape.length) {
    throw new ShardingError('E_SHARD_BAD_DIM', `tensor "${t.name}" of shape [${t.shape}] has no dim ${dim} to split; fix the rule (or plan file entry) that selects it`, { tensor: t.name, dim });
  }
  const size = t.shape[dim]!;
  const sizes = rule.kind === 'fused' ? rule.parts : [size];
  const kvHeads = rule.kind === 'fused' ? rule.partKvHeads ?? [] : [rule.kvHeads ?? 0];
  if (sizes.reduce((a, b) => a + b, 0) !== size || sizes.some((p) => !Number.isInteger(p) || p < 0 || (p === 0 && rule.kind === 'fused'))) {
    throw new ShardingError('E_SHARD_FUSED_PARTS', `tensor "${t.name}": fused parts [${sizes}] are not positive sizes that add up to dim ${dim} of size ${size}; fix the parts of the rule that selects it`, { tensor: t.name, dim, size, parts: sizes });
  }

  const outer = product(t.shape, 0, dim);
  const inner = product(t.shape, dim + 1);
  const parts: PartLayout[] = [];
  let partStart = 0;
  let pieceSize = 0;
  sizes.forEach((partSize, j) => {
    const pieces = piecesOf(t, dim, partSize, kvHeads[j] ?? 0, tpSize);
    const chunk = partSize / pieces;
    parts.push({ base: bytesOf(partStart * inner, 'a slice start', dim), pieceBytes: bytesOf(chunk * inner, 'a slice', dim), replicas: tpSize / pieces });
    partStart += partSize;
    pieceSize += chunk;
  });
  const shape = t.shape.slice();
  shape[dim] = pieceSize;
  const rowPitch = bytesOf(size * inner, 'a row', dim);
  const rowBytes = parts.reduce((a, p) => a + p.pieceBytes, 0);
  // One piece per rank covering whole rows (tp 1, or KV heads replicated everywhere) is the whole tensor.
  if (rowBytes === rowPitch) return { shape, bytes: wholeBytes, outer: 1, rowPitch: wholeBytes, parts: null };
  return { shape, bytes: rowBytes * outer, outer, rowPitch, parts };
}

/**
 * vLLM's VocabParallelEmbedding: the row count is padded to a multiple of padTo, the padded
 * count divided by tp, and rank r holds real rows [min(r*p, rows), min((r+1)*p, rows)).
 */
function layoutPaddedVocab(t: ShardSource, padTo: number, dim: number, tpSize: number, bytesOf: (elements: number, what: string, dim: number) => number): ShardLayout {
  if (dim !== 0 || t.shape.length === 0 || !Number.isSafeInteger(padTo) || padTo < 1) {
    throw new ShardingError('E_SHARD_BAD_DIM', `tensor "${t.name}": vocab padding to ${padTo} applies to dim 0 of a tensor with dims, not dim ${dim} of shape [${t.shape}]; fix the rule that selects it`, { tensor: t.name, dim });
  }
  const rows = t.shape[0]!;
  const padded = Math.ceil(rows / padTo) * padTo;
  if (padded % tpSize !== 0) {
    throw new ShardingError('E_SHARD_INDIVISIBLE', `tensor "${t.name}": dim 0 of ${rows} rows, padded to a multiple of ${padTo} as vLLM does, has size ${padded}, which is not divisible by tp size ${tpSize}; use a tp size that divides ${padded}`, { tensor: t.name, dim, size: padded, tpSize });
  }
  const perRank = padded / tpSize;
  const rowBytes = bytesOf(product(t.shape, 1), 'a row', 0);
  const shape = t.shape.slice();
  shape[0] = perRank;
  return { shape, bytes: perRank * rowBytes, outer: 1, rowPitch: rowBytes, parts: null, vocab: { rows, perRank, rowBytes } };
}

/** The piece rank `rank` holds of a tensor laid out by layoutShard. */
export function shardPiece(t: ShardSource, layout: ShardLayout, rank: number): ShardPiece {
  const { vocab } = layout;
  if (!vocab) return { shape: layout.shape, bytes: layout.bytes, padBytes: 0, regions: shardRegions(t, layout, rank) };
  const start = Math.min(rank * vocab.perRank, vocab.rows);
  const real = Math.min((rank + 1) * vocab.perRank, vocab.rows) - start;
  const bytes = real * vocab.rowBytes;
  const shape = t.shape.slice();
  shape[0] = real;
  const regions = bytes === 0 ? [] : [{ srcOffset: t.begin + start * vocab.rowBytes, rows: 1, rowBytes: bytes, srcPitch: bytes }];
  return { shape, bytes, padBytes: layout.bytes - bytes, regions };
}

export function shardRegions(t: ShardSource, layout: ShardLayout, rank: number): SourceRegion[] {
  if (layout.bytes === 0) return [];
  const { parts, outer, rowPitch } = layout;
  if (parts === null) return [{ srcOffset: t.begin, rows: 1, rowBytes: layout.bytes, srcPitch: layout.bytes }];
  const startOf = (p: PartLayout): number => t.begin + p.base + Math.floor(rank / p.replicas) * p.pieceBytes;
  if (outer === 1) return parts.map((p) => ({ srcOffset: startOf(p), rows: 1, rowBytes: p.pieceBytes, srcPitch: p.pieceBytes }));
  if (parts.length === 1) return [{ srcOffset: startOf(parts[0]!), rows: outer, rowBytes: parts[0]!.pieceBytes, srcPitch: rowPitch }];
  // A fused split below dim 0 interleaves parts within each destination row, which the CopyOp
  // contract (dense destination) can express only one row at a time. No built-in rule does
  // this; only a plan file can ask for it.
  const regions: SourceRegion[] = [];
  for (let r = 0; r < outer; r++) {
    for (const p of parts) regions.push({ srcOffset: startOf(p) + r * rowPitch, rows: 1, rowBytes: p.pieceBytes, srcPitch: p.pieceBytes });
  }
  return regions;
}

/**
 * Where a rank's piece lies in the whole tensor's own bytes (C order, offset 0): the regions a
 * writer gathers, in order, to make the piece from a full tensor (begin_update's `piece`, so a
 * trainer that holds whole tensors writes every rank's piece by this one rule). Undefined when
 * the piece is the whole tensor.
 */
export function pieceOfWhole(t: { name: string; dtype: string; fullShape?: number[]; rule?: ShardRule }, tpSize: number, rank: number): { fullShape: number[]; regions: SourceRegion[] } | undefined {
  if (tpSize < 2 || !t.fullShape || !t.rule || t.rule.kind === 'replicated') return undefined;
  const source: ShardSource = { name: t.name, dtype: t.dtype as SafetensorsDtype, shape: t.fullShape, begin: 0 };
  const layout = layoutShard(source, t.rule, tpSize);
  if (layout.parts === null && !layout.vocab) return undefined;
  return { fullShape: t.fullShape, regions: shardPiece(source, layout, rank).regions };
}
