// The compatibility fingerprint a client compares before it maps the cache: if anything that
// decides which bytes sit where, or the bytes themselves, differs, the client must fall back to
// disk. Each field is hashed on its own so that a mismatch can be reported field by field.
// File paths are left out on purpose: the same weights copied to another directory or node give
// the same fingerprint.
//
// docs/spec/fingerprint.md specifies every field byte for byte; the Python client computes the
// same fields without Node (clients/python/weightd_client/fingerprint.py), and the vectors in
// test/vectors/fingerprint hold both to it. So every input here is something Python can read
// from the checkpoint directory itself: no field hashes TypeScript tables.

import { createHash } from 'node:crypto';
import { canonicalJson } from './canonicalJson.js';

/** Bumped whenever the fingerprint's meaning, the plan layout or the wire contract changes. */
export const PROTOCOL_VERSION = 2;

/**
 * The built-in sharding rules (tpRules.ts) as a versioned identifier. Any change to those
 * tables, or to which architectures they cover, bumps the version; a test holds a hash of the
 * tables to it.
 */
export const BUILTIN_RULES = 'weightd-rules@2';

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** The model config values the sharding rules read (readModelConfig's, after its defaults). */
export interface ShardingConfig {
  numAttentionHeads: number | null;
  numKeyValueHeads: number | null;
  headDim: number | null;
  tieWordEmbeddings: boolean | null;
}

export interface FingerprintInput {
  /** Each shard's headerSha256, in file order. */
  headerHashes: string[];
  /** Each shard's content digest (sampleContent.ts), in file order. */
  contentDigests: string[];
  architecture: string;
  tpSize: number;
  /** Every tensor's dtype (repeats allowed) plus config.json's torch_dtype. */
  dtypes: string[];
  torchDtype: string | null;
  quantization: unknown;
  config: ShardingConfig;
  /** The user plan file's JSON as parsed, or null when there is none. */
  planFile: unknown;
}

export interface Fingerprint {
  fingerprint: string;
  fields: Record<string, string>;
}

export function fingerprintCheckpoint(input: FingerprintInput): Fingerprint {
  // A hash of per-file hashes pins down what one hash over every file's bytes would, and lets
  // each shard be read in a worker without moving its bytes.
  const { config } = input;
  const fields: Record<string, string> = {
    headers: sha256Hex(input.headerHashes.join('\n')),
    content: sha256Hex(input.contentDigests.join('\n')),
    architecture: sha256Hex(input.architecture),
    config: sha256Hex(canonicalJson({
      numAttentionHeads: config.numAttentionHeads, numKeyValueHeads: config.numKeyValueHeads, headDim: config.headDim, tieWordEmbeddings: config.tieWordEmbeddings,
    })),
    tpSize: sha256Hex(String(input.tpSize)),
    dtypes: sha256Hex(canonicalJson({ tensors: [...new Set(input.dtypes)].sort(), torchDtype: input.torchDtype })),
    quantization: sha256Hex(canonicalJson(input.quantization ?? null)),
    plan: sha256Hex(canonicalJson({ builtinRules: BUILTIN_RULES, planFile: input.planFile === null ? null : sha256Hex(canonicalJson(input.planFile)) })),
    protocol: sha256Hex(String(PROTOCOL_VERSION)),
  };
  return { fingerprint: sha256Hex(canonicalJson(fields)), fields };
}

export function rankFingerprint(checkpointFingerprint: string, tpRank: number): string {
  return sha256Hex(`${checkpointFingerprint}:${tpRank}`);
}

/**
 * The full-content fingerprint's protocol version (docs/spec/fingerprint.md §8): version 2's
 * fields with `content` over every tensor's full digest instead of the sample. A daemon answers
 * to both; a client computes whichever it can pay for.
 */
export const FULL_PROTOCOL_VERSION = 3;

/**
 * Version 3's checkpoint fields and fingerprint from version 2's fields and every tensor's digest
 * (file by file, in data order: RankPlan.contentTensors' order).
 */
export function fullContentFingerprint(sampledFields: Record<string, string>, tensorDigests: readonly string[]): Fingerprint {
  const fields = { ...sampledFields, content: sha256Hex(tensorDigests.join('\n')), protocol: sha256Hex(String(FULL_PROTOCOL_VERSION)) };
  return { fingerprint: sha256Hex(canonicalJson(fields)), fields };
}

/**
 * The `protocol` of a version a writer filled (docs/spec/fingerprint.md §9): its content is what
 * was written into the ranks' segments, not a checkpoint's files.
 */
export const WRITTEN_PROTOCOL = 'written-1';

/**
 * A written version's fields and fingerprint (docs/spec/fingerprint.md §9): the base version's
 * version 2 fields, with `content` over every tp rank's tensor digests (each rank's in its
 * manifest's order, ranks in tp order) and `protocol` naming the rule.
 */
export function writtenVersionFingerprint(baseFields: Record<string, string>, rankDigests: readonly (readonly string[])[]): Fingerprint {
  const ranks = rankDigests.map((digests) => sha256Hex(digests.join('\n')));
  const fields = { ...baseFields, content: sha256Hex(ranks.join('\n')), protocol: sha256Hex(WRITTEN_PROTOCOL) };
  return { fingerprint: sha256Hex(canonicalJson(fields)), fields };
}
