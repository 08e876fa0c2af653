// Builds the per-rank load plan of a checkpoint directory: which tensors each tensor-parallel
// rank holds, where each lands in the rank's arena, and which file bytes fill it. Everything
// that can be wrong with the checkpoint or the sharding is found here, before any byte moves.

import { resolve } from 'node:path';
import type { Piscina } from 'piscina';
import { CheckpointError, ShardingError } from '../errors.js';
import { fingerprintCheckpoint, rankFingerprint } from './fingerprint.js';
import { fileIdentities } from '../files/fileIdentity.js';
import type { HeaderResult, HeaderTask } from './headerWorker.js';
import type { SafetensorsTensor } from './parseSafetensors.js';
import { parseShards, sampleShards } from './parseShards.js';
import type { FileSampler } from './sampleContent.js';
import { checkTensorsAgainstIndex, INDEX_FILE, readCheckpointIndex } from './readCheckpointIndex.js';
import { readModelConfig, type ModelConfig } from './readModelConfig.js';
import { readPlanFile } from './readPlanFile.js';
import { arenaSegmentBytes, type SegmentCut } from './arenaSegmentBytes.js';
import type { EngineLayout } from './layouts/engineLayout.js';
import { CHECKPOINT_LAYOUT, engineLayout, isLayoutName, layoutNames, unknownLayoutMessage } from './layouts/layoutRegistry.js';
import { layoutShard, shardPiece, type ShardLayout, type ShardPiece } from './shardTensor.js';
import { checkHeadCounts, familyOf, ruleForRole, scaledWeightName, type ArchitectureFamily, type TensorRule } from './tpRules.js';
import type { CheckpointPlan, ContentTensors, CopyOp, LayoutName, RankPlan, ShardRule, TensorEntry, TensorView, ZeroRange } from './types.js';

/** Tensor offsets in an arena are multiples of this (what cudaMalloc guarantees and kernels assume). */
export const ARENA_ALIGNMENT = 256;

export interface PlanOptions {
  tpSize: number;
  /** A user plan file whose rules come before the built-in ones. */
  planFile?: string;
  /**
   * Layouts to serve besides `checkpoint` (always served). Planning an engine layout places
   * its fused parameters' pieces back to back and reserves its padding rows in the arena.
   */
  layouts?: readonly LayoutName[];
  /** A header-parsing pool to reuse (see parseShards.createHeaderPool); otherwise one is made when needed. */
  pool?: Piscina<HeaderTask, HeaderResult>;
  /**
   * Who samples the tensors' bytes for the content fingerprint, where not the pool (sampleShards):
   * a daemon's addon, on libuv threads (src/native/sampleDigest.ts).
   */
  sampler?: FileSampler;
  /**
   * How each rank's arena is cut when the plan file sets no segmentBytes (arenaSegmentBytes.ts;
   * default 'whole'). A function picks once the ranks' fingerprints are known: a restart cuts an
   * arena as the shards a keeper holds for it were cut, so that it adopts them.
   */
  segments?: SegmentCut | ((rankFingerprints: readonly string[]) => SegmentCut);
}

interface SourceTensor extends SafetensorsTensor {
  file: number;
}

const REPLICATED: ShardRule = { kind: 'replicated' };
const UNPLACED_LISTED = 20;

const alignUp = (n: number): number => Math.ceil(n / ARENA_ALIGNMENT) * ARENA_ALIGNMENT;

/**
 * Each planning phase of a 100k-tensor model runs for a few hundred ms; yielding between
 * phases and between ranks keeps the daemon's sockets, timers and state machine served.
 */
const yieldToEventLoop = (): Promise<void> => new Promise((done) => setImmediate(done));

/**
 * The rule of a quantization scale follows its weight's rule when the scale's shape can be cut
 * the same way: per-channel scales of a column split, block scales whose every piece covers the
 * same rows as the weight's piece (whole blocks; KV heads cut into as many pieces as the
 * weight's); a fused weight's parts are rescaled to the scale's size along that dim. Anything
 * else is replicated: scales are small, and the engine's loader slices what it needs from a full
 * copy. `block` is config.json's weight_block_size, for scales whose last block is partial.
 */
function ruleForScale(weightRule: ShardRule, weightShape: number[], scale: SourceTensor, tpSize: number, block: readonly number[] | null): ShardRule {
  // A padded vocab part has rows the scale does not: the engine slices a full copy.
  if (weightRule.kind === 'replicated' || scale.shape.length !== weightShape.length || (weightRule.kind === 'split' && weightRule.padTo !== undefined)) return REPLICATED;
  const { dim } = weightRule;
  const [w, s] = [weightShape[dim]!, scale.shape[dim]!];
  // Rows (or columns) of the weight one scale entry covers.
  const unit = block?.[dim] !== undefined && Math.ceil(w / block[dim]!) === s ? block[dim]! : w % s === 0 ? w / s : undefined;
  const weightParts = weightRule.kind === 'fused' ? weightRule.parts : [w];
  const kvHeads = weightRule.kind === 'fused' ? weightRule.partKvHeads ?? [] : [weightRule.kvHeads ?? 0];
  // KV heads fewer than tp: the weight is cut into kvHeads pieces, else into tp (shardTensor).
  const pieces = weightParts.map((_, j) => ((kvHeads[j] ?? 0) > 0 && tpSize > kvHeads[j]! ? kvHeads[j]! : tpSize));
  const parts = weightParts.map((p) => (p * s) / w);
  if (unit === undefined || !parts.every(Number.isInteger)) return REPLICATED;
  const whole = weightParts.every((p, j) => pieces[j] === 1 || (parts[j]! % pieces[j]! === 0 && p / pieces[j]! === (parts[j]! / pieces[j]!) * unit));
  if (!whole) return REPLICATED;
  const scaleKv = kvHeads.map((k, j) => (k > 0 ? pieces[j]! : 0));
  const candidate: ShardRule = weightRule.kind === 'fused' ? { ...weightRule, parts, ...(weightRule.partKvHeads ? { partKvHeads: scaleKv } : {}) } : { ...weightRule, ...(weightRule.kvHeads ? { kvHeads: scaleKv[0]! } : {}) };
  try {
    layoutShard(scale, candidate, tpSize);
    return candidate;
  } catch (err) {
    if (err instanceof ShardingError) return REPLICATED;
    throw err;
  }
}

/** quantization_config.weight_block_size ([rows, columns] of a block-FP8 scale entry), or null. */
function weightBlockSize(config: ModelConfig): number[] | null {
  const q = config.quantization as { weight_block_size?: unknown } | null;
  const block = q && typeof q === 'object' ? q.weight_block_size : undefined;
  return Array.isArray(block) && block.length === 2 && block.every((b) => Number.isSafeInteger(b) && b > 0) ? block as number[] : null;
}

class RuleResolver {
  private readonly rules: TensorRule[];
  constructor(
    userRules: TensorRule[],
    private readonly family: ArchitectureFamily | null,
    private readonly config: ModelConfig,
    private readonly byName: Map<string, SourceTensor>,
    private readonly tpSize: number,
    private readonly block: readonly number[] | null,
  ) {
    this.rules = [...userRules, ...(family?.rules ?? [])];
  }

  private direct(name: string, shape: number[]): ShardRule | null {
    const match = this.rules.find((r) => r.pattern.test(name));
    if (!match) return null;
    return typeof match.spec === 'string' ? ruleForRole(match.spec, name, shape, this.config) : match.spec;
  }

  /** null: no rule places this tensor. */
  resolve(t: SourceTensor): ShardRule | null {
    const rule = this.direct(t.name, t.shape);
    if (rule) return rule;
    const weightName = scaledWeightName(t.name);
    if (weightName !== null) {
      const weight = this.byName.get(weightName);
      const weightRule = weight && this.direct(weight.name, weight.shape);
      return weight && weightRule ? ruleForScale(weightRule, weight.shape, t, this.tpSize, this.block) : REPLICATED;
    }
    // In a known family, a tensor no table names and that has at most one dim is a norm or a
    // bias of a replicated layer. A matrix no rule names is an error instead: replicating it
    // blindly would hand the engine a full matrix where it expects a shard.
    if (this.family && t.shape.length <= 1) return REPLICATED;
    return null;
  }
}

/** Ties lm_head to the input embedding the way HF and vLLM do; returns alias -> target. */
function tiedAliases(family: ArchitectureFamily | null, config: ModelConfig, byName: Map<string, SourceTensor>): Record<string, string> {
  if (!family || !byName.has(family.embedding)) return {};
  const tied = config.tieWordEmbeddings ?? family.tiedByDefault;
  if (tied) return { [family.lmHead]: family.embedding };
  if (!byName.has(family.lmHead)) {
    const why = config.tieWordEmbeddings === false ? 'config.json sets tie_word_embeddings to false' : `config.json leaves out tie_word_embeddings, which defaults to false for ${family.family} models`;
    throw new CheckpointError('E_CKPT_MISSING_TENSOR', `tensor "${family.lmHead}" is missing and ${why}, so nothing can stand in for it; set tie_word_embeddings to true if the model shares its embedding, or use a complete checkpoint`, { tensor: family.lmHead });
  }
  return {};
}

/**
 * Appends an op, or extends the previous one when both read and write back-to-back bytes, so
 * the copy engine issues fewer, larger copies (a tp-1 plan of a typical shard is one op).
 */
function pushOp(ops: CopyOp[], op: CopyOp): void {
  const prev = ops[ops.length - 1];
  if (prev && prev.rows === 1 && op.rows === 1 && prev.file === op.file && prev.segment === op.segment
    && prev.srcOffset + prev.rowBytes === op.srcOffset && prev.dstOffset + prev.rowBytes === op.dstOffset) {
    prev.rowBytes += op.rowBytes;
    prev.srcPitch = prev.rowBytes;
  } else {
    ops.push(op);
  }
}

interface PlannedTensor {
  source: SourceTensor;
  rule: ShardRule;
  layout: ShardLayout;
}

/** An engine parameter resolved against the plan: its members are indexes into the planned tensors. */
interface PlannedParam {
  name: string;
  members: number[];
  experts: number;
  /** Per-tensor scales: one scalar a member, the view [slots] or [experts, slots] ([experts] for one slot). */
  scalars: boolean;
}

interface EngineLayoutPlan {
  name: LayoutName;
  params: PlannedParam[];
}

const isScalar = (shape: readonly number[]): boolean => shape.length === 0 || (shape.length === 1 && shape[0] === 1);

/**
 * Resolves an engine layout's parameters against the planned tensors and checks, once for all
 * ranks, that the members of a fused parameter can form one dense block: one dtype, equal
 * trailing dims (a rank's pieces only differ in rows), or scalars all.
 */
function planEngineLayout(layout: EngineLayout, architecture: string, planned: PlannedTensor[], tpSize: number): EngineLayoutPlan {
  const { name, engine } = layout;
  const index = new Map(planned.map((p, i) => [p.source.name, i]));
  const params = layout.params(architecture, planned.map((p) => p.source.name)).map((param): PlannedParam => {
    const members = param.members.map((m) => index.get(m)!);
    const first = planned[members[0]!]!;
    const scalars = /(weight_scale|input_scale)$/.test(param.name) && members.every((i) => isScalar(planned[i]!.source.shape));
    for (const i of members) {
      const { source, layout, rule } = planned[i]!;
      const weight = source.name.endsWith('.weight_scale_inv') ? planned[index.get(source.name.replace(/_scale_inv$/, ''))!] : undefined;
      // Only a weight that this tp size cuts (layout.parts) needs its block scale cut alike.
      if (weight && rule.kind === 'replicated' && weight.layout.parts !== null) {
        throw new ShardingError('E_LAYOUT_SCALE_BLOCKS', `the ${name} parameter "${param.name}": block scale "${source.name}" [${source.shape}] cannot be cut like its weight [${weight.source.shape}] at tp size ${tpSize}, since its blocks would straddle ranks (${engine}'s block-FP8 linear methods refuse such a partition too); use a tp size whose partitions are whole blocks`, { param: param.name, tensor: source.name, tpSize, layout: name });
      }
      const stacks = scalars || members.length === 1 || (layout.shape.length > 0 && layout.shape.slice(1).join() === first.layout.shape.slice(1).join());
      if (source.dtype !== first.source.dtype || !stacks) {
        throw new ShardingError('E_LAYOUT_MEMBER_SHAPE', `the ${name} parameter "${param.name}" stacks ${param.members.join(', ')}, but "${source.name}" (${source.dtype} [${source.shape}]) does not stack with "${first.source.name}" (${first.source.dtype} [${first.source.shape}]): the pieces of a fused parameter need one dtype and equal trailing dims; the checkpoint is not a ${architecture} checkpoint ${engine} can load`, { param: param.name, tensor: source.name, layout: name });
      }
    }
    return { name: param.name, members, experts: param.experts, scalars };
  });
  return { name, params };
}

function planRank(
  tensors: PlannedTensor[],
  files: string[],
  tpSize: number,
  rank: number,
  aliases: Record<string, string>,
  engines: EngineLayoutPlan[],
  segmentBytes: number,
): Omit<RankPlan, 'fingerprint' | 'contentTensors'> {
  const entries = new Array<TensorEntry>(tensors.length);
  const segments: number[] = [];
  let segment = 0;
  const ops: CopyOp[] = [];
  const zeroRanges: ZeroRange[] = [];
  let totalBytes = 0;
  /** Writes tensor i's piece at `at`, then its padding if `padded`; returns the piece and where it ends. */
  const place = (i: number, at: number, padded: boolean): { piece: ShardPiece; end: number } => {
    const { source: t, rule, layout } = tensors[i]!;
    const piece = shardPiece(t, layout, rank);
    entries[i] = { name: t.name, dtype: t.dtype, shape: piece.shape, segment, offset: at, bytes: piece.bytes, fullShape: t.shape, rule };
    let dst = at;
    for (const r of piece.regions) {
      pushOp(ops, { file: t.file, segment, srcOffset: r.srcOffset, dstOffset: dst, rows: r.rows, rowBytes: r.rowBytes, srcPitch: r.srcPitch });
      dst += r.rows * r.rowBytes;
      totalBytes += r.rows * r.rowBytes;
    }
    if (!padded || piece.padBytes === 0) return { piece, end: dst };
    zeroRanges.push({ segment, offset: dst, bytes: piece.padBytes });
    return { piece, end: dst + piece.padBytes };
  };

  // At most one: planCheckpoint refuses a second engine layout.
  const engine = engines[0];
  const paramOf = new Map<number, PlannedParam>();
  for (const p of engine?.params ?? []) for (const m of p.members) paramOf.set(m, p);
  const views: TensorView[] = [];
  let cursor = 0;
  // Arena order is checkpoint order; a fused parameter is placed whole where its first member comes.
  for (let i = 0; i < tensors.length; i++) {
    if (entries[i]) continue;
    // A tensor (or fused parameter) is never cut: a new segment begins before one once the current holds segmentBytes.
    if (cursor >= segmentBytes) {
      segments.push(alignUp(cursor));
      segment++;
      cursor = 0;
    }
    const start = alignUp(cursor);
    const param = paramOf.get(i);
    if (!param) {
      // Padding exists only in an engine's view: the checkpoint view is the real rows.
      cursor = place(i, start, false).end;
      continue;
    }
    let at = start;
    let rows = 0;
    for (const m of param.members) {
      const { piece, end } = place(m, at, true);
      // A padded vocab piece spans its whole part, real rows and zero rows.
      rows += piece.padBytes > 0 ? tensors[m]!.layout.shape[0]! : (piece.shape[0] ?? 1);
      at = end;
    }
    const first = tensors[param.members[0]!]!;
    const trailing = entries[param.members[0]!]!.shape.slice(1);
    const slots = param.members.length / Math.max(param.experts, 1);
    const shape = param.scalars
      ? param.experts === 0 ? [slots] : slots === 1 ? [param.experts] : [param.experts, slots]
      : param.members.length === 1 && param.experts === 0 && first.layout.vocab === undefined
        ? entries[param.members[0]!]!.shape
        : param.experts > 0 ? [param.experts, rows / param.experts, ...trailing] : [rows, ...trailing];
    views.push({ name: param.name, dtype: first.source.dtype, shape, segment, offset: start, bytes: at - start });
    cursor = at;
  }
  const layouts: RankPlan['layouts'] = engine ? { [engine.name]: { tensors: views, aliases: {} } } : {};
  segments.push(alignUp(cursor));
  return { tpRank: rank, tpSize, files, segments, tensors: entries, aliases, ops, layouts, zeroRanges, totalBytes };
}

/** The engine layouts asked for, in the registry's order, each once; an unknown name is an error. */
function engineLayoutsAsked(asked: readonly string[]): EngineLayout[] {
  const unknown = asked.find((name) => !isLayoutName(name));
  if (unknown !== undefined) throw new ShardingError('E_LAYOUT_UNKNOWN', unknownLayoutMessage(unknown), { layout: unknown });
  return layoutNames().flatMap((name) => {
    const layout = engineLayout(name);
    return layout && asked.includes(name) ? [layout] : [];
  });
}

export async function planCheckpoint(modelDir: string, opts: PlanOptions): Promise<CheckpointPlan> {
  const { tpSize } = opts;
  if (!Number.isSafeInteger(tpSize) || tpSize < 1) {
    throw new ShardingError('E_SHARD_TP_SIZE', `tp size ${tpSize} is not a positive integer; pass the engine's --tensor-parallel-size`, { tpSize });
  }
  const dir = resolve(modelDir);
  const index = await readCheckpointIndex(dir);
  const config = await readModelConfig(dir);
  const family = familyOf(config.architecture);
  const planFile = opts.planFile ? await readPlanFile(opts.planFile) : null;
  const userRules = planFile?.rules ?? [];
  const files = index.files.map((f) => resolve(dir, f));
  // Before any byte is read: a write from here on moves a file's ctime, which the checks compare.
  const identities = fileIdentities(files);
  const headers = await parseShards(files, opts.pool);
  checkTensorsAgainstIndex(index, headers, resolve(dir, INDEX_FILE));
  if (family) checkHeadCounts(config, tpSize);
  // The only step that reads tensor bytes, started once the headers are known good: it runs in
  // the pool, or on the sampler's threads, while this thread plans (at 50k tensors each took
  // hundreds of ms, one after the other). A plan that fails leaves it to finish unheard.
  const sampling = sampleShards(headers, opts.pool, opts.sampler);
  sampling.catch(() => {});
  await yieldToEventLoop();

  // Arena order is file order, then offset order: deterministic, and sequential reads.
  const all: SourceTensor[] = headers.flatMap((h, file) => h.tensors.map((t) => ({ ...t, file })));
  const byName = new Map(all.map((t) => [t.name, t]));
  const aliases = tiedAliases(family, config, byName);
  const loaded = all.filter((t) => !Object.hasOwn(aliases, t.name));

  await yieldToEventLoop();
  const resolver = new RuleResolver(userRules, family, config, byName, tpSize, weightBlockSize(config));
  const planned: PlannedTensor[] = [];
  const unplaced: string[] = [];
  for (const source of loaded) {
    const rule = resolver.resolve(source);
    if (rule) planned.push({ source, rule, layout: layoutShard(source, rule, tpSize) });
    else unplaced.push(source.name);
  }
  if (unplaced.length) {
    const listed = unplaced.slice(0, UNPLACED_LISTED).map((n) => `  ${n} [${byName.get(n)!.shape}]`).join('\n');
    const more = unplaced.length > UNPLACED_LISTED ? `\n  ... and ${unplaced.length - UNPLACED_LISTED} more` : '';
    const why = family
      ? `no ${family.family} sharding rule matches ${unplaced.length} tensor(s)`
      : `weightd has no sharding rules for architecture "${config.architecture}"${userRules.length ? ' and the plan file matches none of' : ', so it cannot place'} ${unplaced.length} tensor(s)`;
    throw new ShardingError('E_SHARD_UNPLACED', `${dir}: ${why}:\n${listed}${more}\nWrite a plan file ({"rules": [{"pattern": "<regex>", "rule": "column" | "row" | "replicated"}]}, see docs/sharding.md) and pass it as planFile`, { architecture: config.architecture, tensors: unplaced.slice(0, UNPLACED_LISTED), count: unplaced.length });
  }

  const contentDigests = await sampling;
  const { fingerprint, fields } = fingerprintCheckpoint({
    headerHashes: headers.map((h) => h.headerSha256),
    contentDigests,
    architecture: config.architecture,
    tpSize,
    dtypes: all.map((t) => t.dtype),
    torchDtype: config.torchDtype,
    quantization: config.quantization,
    config,
    planFile: planFile?.json ?? null,
  });
  const asked = engineLayoutsAsked(opts.layouts ?? []);
  // An engine layout this checkpoint cannot have is refused alone: the checkpoint layout and the
  // engines that use it still get the cache, and an engine asking for the refused one is told
  // why and loads from disk, as on any other doubt.
  const engines: EngineLayoutPlan[] = [];
  const refusedLayouts: CheckpointPlan['refusedLayouts'] = {};
  for (const layout of asked) {
    try {
      // A rank's arena places each fused parameter's members once, back to back: two engine
      // layouts would each want them in their own order.
      if (engines.length > 0) {
        throw new ShardingError('E_LAYOUT_COMBINATION', `layout "${layout.name}" cannot be planned beside "${engines[0]!.name}": a model's arena holds one engine layout; load the checkpoint again under another model name for the other engine`, { layout: layout.name });
      }
      engines.push(planEngineLayout(layout, config.architecture, planned, tpSize));
    } catch (err) {
      if (!(err instanceof ShardingError)) throw err;
      refusedLayouts[layout.name] = { code: err.code, message: err.message };
    }
  }
  const contentTensors: ContentTensors = { names: all.map((t) => t.name), ranges: all.map((t) => ({ file: t.file, start: t.begin, end: t.end })) };
  const fingerprints = Array.from({ length: tpSize }, (_, rank) => rankFingerprint(fingerprint, rank));
  const cut = typeof opts.segments === 'function' ? opts.segments(fingerprints) : opts.segments ?? 'whole';
  // Every rank's piece of a tensor has the same size, so one bound serves every rank's arena.
  const arenaBound = planned.reduce((n, p) => n + alignUp(p.layout.bytes), 0);
  const segmentBytes = arenaSegmentBytes(cut, arenaBound, planFile?.segmentBytes);
  const ranks: RankPlan[] = [];
  for (let rank = 0; rank < tpSize; rank++) {
    await yieldToEventLoop();
    ranks.push({ ...planRank(planned, files, tpSize, rank, aliases, engines, segmentBytes), fingerprint: fingerprints[rank]!, contentTensors });
  }
  return { modelDir: dir, architecture: config.architecture, tpSize, fingerprint, fingerprintFields: fields, layouts: [CHECKPOINT_LAYOUT, ...engines.map((e) => e.name)], refusedLayouts, ranks, files: identities };
}
