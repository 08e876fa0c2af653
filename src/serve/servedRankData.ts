import type { CheckpointPlan, LayoutName, RankLayout, TensorEntry } from '../checkpoint/types.js';
import { fullContentFingerprint, rankFingerprint } from '../checkpoint/fingerprint.js';
import { arenaTensorDigests } from '../checkpoint/arenaTensorDigests.js';
import { rankFingerprintFields } from '../checkpoint/rankFingerprintFields.js';
import type { Backend, DeviceInfo, FillOptions, SegmentExport } from '../native/addon.js';
import type { FileIdentity } from '../files/fileIdentity.js';

/** Everything the serving layer needs to know about one resident rank. Plain data. */
export interface ServedRankData {
  nodeRank: number;
  nnodes: number;
  localRank: number;
  globalRank: number;
  tpSize: number;
  backend: Backend;
  device: DeviceInfo;
  /** The model's name (--model's directory name unless named): what swaps and watches go by. */
  name: string;
  /** Its model version's number (PlannedModel.version; absent: 0, a checkpoint). */
  version?: number;
  /** The checkpoint directory. */
  model: string;
  architecture: string;
  /** This rank's fingerprint (checkpoint fingerprint + rank). */
  fingerprint: string;
  /** Each fingerprinted field's own hash, so a mismatch can name the fields that differ. */
  fingerprintFields: Record<string, string>;
  /**
   * Proof of content, once the fill digested every tensor (or a keeper's record carried the
   * digests): each checkpoint tensor's full digest by name, and this rank's version 3 fingerprint
   * (docs/spec/fingerprint.md §8), which get_state accepts as well as `fingerprint`.
   */
  full?: { fingerprint: string; fingerprintFields: Record<string, string>; digests: Record<string, string> };
  /**
   * Per tensor of `tensors`, the digest of its bytes as the arena holds them, where known: a
   * written version's every one, a checkpoint's where its fill's digest is of the same bytes
   * (arenaTensorDigests). A commit over this version reuses them for the segments it shares.
   */
  arenaDigests?: (string | undefined)[];
  /** The `checkpoint` layout's views. */
  tensors: TensorEntry[];
  aliases: Record<string, string>;
  /** Every layout served, `checkpoint` (the two fields above) included, in the plan's order. */
  layouts: Record<LayoutName, RankLayout>;
  /** Layouts asked for that could not be planned for this checkpoint, and why (CheckpointPlan). */
  refusedLayouts?: CheckpointPlan['refusedLayouts'];
  segments: SegmentExport[];
  /** The checkpoint files' identity when it was planned: a change makes the version stale (filesCheck.ts). */
  files: FileIdentity[];
  /**
   * cuda: where a writer's commit and an engine's publish on this rank hash their digests, the
   * model's fill option as nodeFillOptions resolved it (absent: DEFAULT_DIGESTS_ON); so a digestOn
   * given in code reaches them as it reaches the fill.
   */
  digestOn?: FillOptions['digestOn'];
}

/** Builds what a rank's server serves from the node's plan and the rank's loaded device. */
export function toServedRankData(args: {
  name: string;
  version?: number;
  plan: CheckpointPlan;
  globalRank: number;
  localRank: number;
  nodeRank: number;
  nnodes: number;
  backend: Backend;
  device: DeviceInfo;
  segments: SegmentExport[];
  /** The rank's plan's contentTensors' digests, in order; empty when unknown. With `written`, its own tensors' digests, in its manifest's order. */
  digests?: readonly string[];
  /** A version a writer committed: its fingerprint is over its content already (§9), so it is its own full fingerprint. */
  written?: boolean;
  /** The model's fill option (FillOptions.digestOn, resolved): where this rank's commits and publishes hash. */
  digestOn?: FillOptions['digestOn'];
}): ServedRankData {
  const rank = args.plan.ranks[args.globalRank]!;
  const names = rank.contentTensors.names;
  let full: ServedRankData['full'];
  let arenaDigests: ServedRankData['arenaDigests'];
  if (args.written && args.digests?.length === rank.tensors.length) {
    const digests = [...args.digests];
    arenaDigests = digests;
    full = withDigestsByName({ fingerprint: rank.fingerprint, fingerprintFields: rankFingerprintFields(args.plan.fingerprintFields, args.globalRank) }, rank.tensors.map((t) => t.name), digests);
  } else if (!args.written && args.digests && args.digests.length > 0 && args.digests.length === names.length) {
    const { fingerprint, fields } = fullContentFingerprint(args.plan.fingerprintFields, args.digests);
    full = withDigestsByName({ fingerprint: rankFingerprint(fingerprint, args.globalRank), fingerprintFields: rankFingerprintFields(fields, args.globalRank) }, names, [...args.digests]);
    arenaDigests = arenaTensorDigests(rank, args.digests);
  }
  return {
    nodeRank: args.nodeRank,
    nnodes: args.nnodes,
    localRank: args.localRank,
    globalRank: args.globalRank,
    tpSize: args.plan.tpSize,
    backend: args.backend,
    device: args.device,
    name: args.name,
    ...(args.version ? { version: args.version } : {}),
    model: args.plan.modelDir,
    architecture: args.plan.architecture,
    fingerprint: rank.fingerprint,
    fingerprintFields: rankFingerprintFields(args.plan.fingerprintFields, args.globalRank),
    ...(full ? { full } : {}),
    ...(arenaDigests ? { arenaDigests } : {}),
    tensors: rank.tensors,
    aliases: rank.aliases,
    layouts: Object.fromEntries(args.plan.layouts.map((l) => [l, l === 'checkpoint' ? { tensors: rank.tensors, aliases: rank.aliases } : rank.layouts[l]!])),
    refusedLayouts: args.plan.refusedLayouts,
    segments: args.segments,
    files: args.plan.files,
    ...(args.digestOn ? { digestOn: args.digestOn } : {}),
  };
}

/**
 * `full` with its digests by name made on first read: only a get_state that asks for digests
 * reads them (src/serve/encodedManifest.ts). Made at once, the object of 50,439 names took ~20 ms
 * of the development VM's CPU in every version a writer's commit published, on its reply's path
 * (bench/RESULTS.md, issue 31).
 */
function withDigestsByName(full: Omit<NonNullable<ServedRankData['full']>, 'digests'>, names: readonly string[], digests: readonly string[]): NonNullable<ServedRankData['full']> {
  let byName: Record<string, string> | undefined;
  return Object.defineProperty(full, 'digests', {
    enumerable: true,
    get: () => (byName ??= Object.fromEntries(names.map((n, i) => [n, digests[i]!]))),
  }) as NonNullable<ServedRankData['full']>;
}
