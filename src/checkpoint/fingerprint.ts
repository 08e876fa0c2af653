// The compatibility fingerprint a client compares before it maps the cache: if anything that
// decides which bytes sit where differs, the client must fall back to disk. Each field is hashed
// on its own so that a mismatch can be reported field by field. File paths are left out on
// purpose: the same weights copied to another directory or node give the same fingerprint.

import { createHash } from 'node:crypto';
import type { ShardRule } from './types.js';

/** Bumped whenever the plan layout or the wire contract changes meaning. */
export const PROTOCOL_VERSION = 1;

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** JSON with object keys sorted at every level, so equal values always hash equally. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) return v;
    const o = v as Record<string, unknown>;
    return Object.fromEntries(Object.keys(o).sort().map((k) => [k, o[k]]));
  });
}

export interface FingerprintInput {
  /** Each shard's headerSha256, in file-name order. */
  headerHashes: string[];
  architecture: string;
  tpSize: number;
  /** Distinct tensor dtypes plus config.json's torch_dtype. */
  dtypes: string[];
  torchDtype: string | null;
  quantization: unknown;
  /** Every loaded tensor's rule, and the aliases: what each rank ends up holding. */
  rules: Array<[string, ShardRule]>;
  aliases: Record<string, string>;
}

export interface Fingerprint {
  fingerprint: string;
  fields: Record<string, string>;
}

export function fingerprintCheckpoint(input: FingerprintInput): Fingerprint {
  // A hash of per-file header hashes equals, in what it pins down, a hash over the raw header
  // bytes in order; it lets each shard be hashed in a worker without moving header bytes.
  const fields: Record<string, string> = {
    headers: sha256Hex(input.headerHashes.join('\n')),
    architecture: sha256Hex(input.architecture),
    tpSize: sha256Hex(String(input.tpSize)),
    dtypes: sha256Hex(canonicalJson({ tensors: [...new Set(input.dtypes)].sort(), torchDtype: input.torchDtype })),
    quantization: sha256Hex(canonicalJson(input.quantization ?? null)),
    plan: planHash(input.rules, input.aliases),
    protocol: sha256Hex(String(PROTOCOL_VERSION)),
  };
  return { fingerprint: sha256Hex(canonicalJson(fields)), fields };
}

/**
 * Hash of every tensor's rule in name order (so the field describes the sharding, not the file
 * layout) and the aliases. Streams into the hash and canonicalizes each distinct rule once:
 * a 100k-tensor model has a handful of distinct rules.
 */
function planHash(rules: Array<[string, ShardRule]>, aliases: Record<string, string>): string {
  const hash = createHash('sha256');
  const canonical = new Map<string, string>();
  const sorted = [...rules].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  for (const [name, rule] of sorted) {
    const key = JSON.stringify(rule);
    let text = canonical.get(key);
    if (text === undefined) canonical.set(key, (text = canonicalJson(rule)));
    hash.update(`${JSON.stringify(name)}:${text}\n`);
  }
  hash.update(canonicalJson(aliases));
  return hash.digest('hex');
}

export function rankFingerprint(checkpointFingerprint: string, tpRank: number): string {
  return sha256Hex(`${checkpointFingerprint}:${tpRank}`);
}
