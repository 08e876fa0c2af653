// A user plan file adds or overrides sharding rules, for architectures weightd has no table for
// or for tensors a table gets wrong. Its rules are tried before the built-in ones, first match
// wins. See docs/sharding.md for the format.

import { z } from 'zod';
import { CheckpointError } from '../errors.js';
import { MAX_CONFIG_BYTES, readSmallFile } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';
import type { TensorRule } from './tpRules.js';

const dim = z.number().int().min(0);

const ruleSchema = z.union([
  z.enum(['column', 'row', 'replicated']),
  z.strictObject({ split: dim, kvHeads: z.number().int().positive().optional() }),
  z.strictObject({
    fused: z.strictObject({
      dim,
      parts: z.array(z.number().int().min(0)).min(1),
      partKvHeads: z.array(z.number().int().min(0)).optional(),
    }),
  }),
]);

const planSchema = z.strictObject({
  rules: z.array(z.strictObject({ pattern: z.string().min(1), rule: ruleSchema })),
  /**
   * Cut each rank's arena into segments of at least this many bytes, at tensor boundaries (absent:
   * the backend's cut, arenaSegmentBytes.ts): a writer's partial update copies only the segments it
   * writes (docs/weight-updates.md).
   */
  segmentBytes: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER).optional(),
});

/** The rules, and the JSON they came from (the fingerprint hashes its canonical form). */
export interface PlanFile {
  rules: TensorRule[];
  segmentBytes?: number;
  json: unknown;
}

export async function readPlanFile(path: string): Promise<PlanFile> {
  let text: string;
  try {
    text = await readSmallFile(path, MAX_CONFIG_BYTES);
  } catch (err) {
    if (err instanceof CheckpointError) throw err;
    throw new CheckpointError('E_PLAN_READ', `plan file ${path}: cannot read it (${(err as Error).message})`, { file: path });
  }
  let json: unknown;
  try {
    json = parseBoundedJson(text);
  } catch (err) {
    throw new CheckpointError('E_PLAN_JSON', `plan file ${path}: not valid JSON (${(err as Error).message})`, { file: path });
  }
  const parsed = planSchema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
    throw new CheckpointError('E_PLAN_SCHEMA', `plan file ${path}: ${issues}. Expected {"rules": [{"pattern": "<regex>", "rule": "column" | "row" | "replicated" | {"split": <dim>} | {"fused": {"dim": <dim>, "parts": [<sizes>]}}}]}`, { file: path });
  }
  const rules = parsed.data.rules.map(({ pattern, rule }, i): TensorRule => {
    let regex: RegExp;
    try {
      regex = new RegExp(pattern);
    } catch (err) {
      throw new CheckpointError('E_PLAN_BAD_REGEX', `plan file ${path}: rules[${i}].pattern ${JSON.stringify(pattern)} is not a valid regular expression (${(err as Error).message})`, { file: path, pattern });
    }
    if (typeof rule === 'string') return { pattern: regex, spec: rule };
    if ('split' in rule) return { pattern: regex, spec: { kind: 'split', dim: rule.split, ...(rule.kvHeads ? { kvHeads: rule.kvHeads } : {}) } };
    const { dim: d, parts, partKvHeads } = rule.fused;
    if (partKvHeads && partKvHeads.length !== parts.length) {
      throw new CheckpointError('E_PLAN_SCHEMA', `plan file ${path}: rules[${i}].rule.fused.partKvHeads has ${partKvHeads.length} entries for ${parts.length} parts; give one per part (0 for non-KV parts)`, { file: path, pattern });
    }
    return { pattern: regex, spec: { kind: 'fused', dim: d, parts, ...(partKvHeads ? { partKvHeads } : {}) } };
  });
  return { rules, json, ...(parsed.data.segmentBytes ? { segmentBytes: parsed.data.segmentBytes } : {}) };
}
