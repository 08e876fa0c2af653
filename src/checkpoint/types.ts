// The load plan is the contract between the checkpoint layer (which decides what each rank
// holds) and the copy engine (which only moves bytes). Everything in it is plain data so it
// can cross worker-thread boundaries and be hashed.
import type { FileIdentity } from '../files/fileIdentity.js';

/** Safetensors dtype names, closed list (see dtypes.ts for sizes). */
export type Dtype = string;

/** How a tensor is divided across tensor-parallel ranks. */
export type ShardRule =
  | { kind: 'replicated' }
  /** Split along `dim` into tp equal parts (column-parallel: dim 0, row-parallel: dim 1). */
  | {
      kind: 'split';
      dim: number;
      /**
       * Set on key/value projections: `dim` is made of this many attention heads. When tp
       * exceeds it, each head is replicated on tp / kvHeads consecutive ranks (vLLM's rule:
       * rank r holds head r / (tp / kvHeads)); tp must then be a multiple of kvHeads.
       */
      kvHeads?: number;
      /**
       * Set on vocab-parallel tensors whose dim 0 is not a multiple of it (vLLM's
       * VocabParallelEmbedding and ParallelLMHead pad to 64): dim 0 is padded up to a multiple
       * of padTo and that divided into tp equal parts; a rank holds the real rows of its part,
       * fewer (or none) on the last ranks. Only dim 0.
       */
      padTo?: number;
    }
  /**
   * A fused tensor made of parts stacked along `dim` (Phi-3 qkv_proj: [q, k, v] rows). Each
   * part is split into tp pieces separately and a rank holds its piece of every part, in order.
   * `parts` are sizes along `dim`; they sum to the tensor's size there.
   */
  | {
      kind: 'fused';
      dim: number;
      parts: number[];
      /** Per part, its number of KV heads (0 for a part that is not a KV projection); see split.kvHeads. */
      partKvHeads?: number[];
    };

/** One named tensor of a layout: a dense view over a rank's arena. */
export interface TensorView {
  name: string;
  dtype: Dtype;
  /** Shape of this rank's piece. */
  shape: number[];
  segment: number;
  /**
   * Byte offset inside the segment, 256-byte aligned, except for the second and later pieces
   * of an engine's fused parameter (see RankPlan.layouts), which follow the previous piece
   * directly so that the fused view is one dense block.
   */
  offset: number;
  bytes: number;
}

/** One tensor as it exists in a rank's arena: its checkpoint-layout view and where it came from. */
export interface TensorEntry extends TensorView {
  /** Shape of the whole tensor in the checkpoint. */
  fullShape?: number[];
  /** How the tensor was divided to produce this piece. */
  rule?: ShardRule;
}

/**
 * One copy from a checkpoint file into the arena. Contiguous ranges have rows = 1. A strided
 * region (a row-parallel slice) is `rows` rows of `rowBytes`, `srcPitch` apart in the file,
 * written densely (`rowBytes` apart) at dstOffset.
 */
export interface CopyOp {
  file: number;
  segment: number;
  srcOffset: number;
  dstOffset: number;
  rows: number;
  rowBytes: number;
  srcPitch: number;
}

/**
 * A layout a rank can be served under: `checkpoint` (the checkpoint's own names and shapes) or an
 * engine layout registered in layouts/layoutRegistry.ts, which every name is checked against.
 */
export type LayoutName = string;

/** A set of views over the same arena, by the names some engine uses. */
export interface RankLayout {
  tensors: TensorView[];
  /** alias name -> view name (tied weights the engine names twice). */
  aliases: Record<string, string>;
}

/** Bytes [start, end) of checkpoint file `file` (an index into RankPlan.files): one tensor's data. */
export interface TensorRange {
  file: number;
  start: number;
  end: number;
}

/**
 * Every tensor of the checkpoint, file by file in data order, tied aliases included: what each
 * rank's fill digests whole (docs/spec/fingerprint.md, version 3), whatever share of it the rank
 * copies. One object shared by every rank of a plan.
 */
export interface ContentTensors {
  names: string[];
  ranges: TensorRange[];
}

/** Bytes of the arena no copy op writes and that must read as zero (vocab padding rows). */
export interface ZeroRange {
  segment: number;
  offset: number;
  bytes: number;
}

export interface RankPlan {
  tpRank: number;
  tpSize: number;
  /** Absolute paths of the checkpoint files that CopyOp.file indexes. */
  files: string[];
  /** Byte size of each arena segment. */
  segments: number[];
  tensors: TensorEntry[];
  /** alias name -> name of the tensor that holds the bytes (tied weights, loaded once). */
  aliases: Record<string, string>;
  ops: CopyOp[];
  /** Layouts besides `checkpoint` (whose views are `tensors` and `aliases`), by name. */
  layouts: Record<LayoutName, RankLayout>;
  /** Padding no op writes: the arena must hold zeros there before the fill. */
  zeroRanges: ZeroRange[];
  /** Payload bytes copied for this rank (sum of rows * rowBytes). */
  totalBytes: number;
  /** Compatibility fingerprint of this rank's shard (checkpoint fingerprint + rank). */
  fingerprint: string;
  /** What the fill digests (the whole checkpoint's tensors). */
  contentTensors: ContentTensors;
}

/**
 * What loading a rank's arena needs of its plan: where each byte comes from, not the views
 * served over it. A rank's worker gets only this; at 50k tensors cloning the views into it cost
 * the main thread ~100 ms of a start-up.
 */
export type RankFillPlan = Pick<RankPlan, 'tpRank' | 'tpSize' | 'files' | 'segments' | 'ops' | 'zeroRanges' | 'totalBytes' | 'fingerprint' | 'contentTensors'>;

/** The fill plan of `plan`: the same objects, without the views. */
export function fillPlanOf(plan: RankPlan): RankFillPlan {
  const { tpRank, tpSize, files, segments, ops, zeroRanges, totalBytes, fingerprint, contentTensors } = plan;
  return { tpRank, tpSize, files, segments, ops, zeroRanges, totalBytes, fingerprint, contentTensors };
}

export interface RefusedLayout {
  code: string;
  message: string;
}

export interface CheckpointPlan {
  modelDir: string;
  architecture: string;
  tpSize: number;
  /** Fingerprint of the checkpoint and sharding, independent of rank and directory. */
  fingerprint: string;
  /** The fields the fingerprint covers, so a mismatch can be reported field by field. */
  fingerprintFields: Record<string, string>;
  /** The layouts every rank is served under, `checkpoint` first. */
  layouts: LayoutName[];
  /**
   * Engine layouts asked for that this checkpoint cannot be served under, and why (the planning
   * error's code and message): each is refused alone, the others still served.
   */
  refusedLayouts: Record<LayoutName, RefusedLayout>;
  ranks: RankPlan[];
  /** Each checkpoint file's identity, recorded before any of its bytes were read (src/files/fileIdentity.ts), in RankPlan.files order. */
  files: FileIdentity[];
}
