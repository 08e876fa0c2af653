// Reads the shared fingerprint vectors (cases.json) and builds each case's model directory from
// its recipe: the same steps clients/python/tests/test_fingerprint.py takes, as
// docs/spec/fingerprint.md ("Test vectors") describes them.
import { cpSync, mkdirSync, openSync, closeSync, readFileSync, writeFileSync, writeSync, ftruncateSync, statSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { dtypeBits, type SafetensorsDtype } from '../../../src/checkpoint/dtypes.js';
import { repoRoot } from '../../helpers/paths.js';

export const VECTORS_DIR = join(repoRoot, 'test/vectors/fingerprint');

export type Mutation =
  | { op: 'overwrite'; file: string; tensor: string; offset: number; length: number; byte: number }
  | { op: 'truncate'; file: string; drop: number }
  | { op: 'config'; set: Record<string, unknown> };

export interface SyntheticModel {
  config: Record<string, unknown>;
  file: string;
  dtype: SafetensorsDtype;
  tensors: Array<[string, number[]]>;
}

export interface Expected {
  checkpointFingerprint: string;
  fields: Record<string, string>;
  /** Per rank: its fingerprint and its tpRank field. */
  ranks: Array<{ fingerprint: string; tpRank: string }>;
  /** The full-content version (docs/spec/fingerprint.md §8): every tensor's digest, the `content` field, the checkpoint's and rank 0's fingerprints. */
  full?: { tensorDigests: Record<string, string>; content: string; checkpointFingerprint: string; rank0: string };
}

export interface VectorCase {
  name: string;
  model: string;
  tpSize: number;
  mutations?: Mutation[];
  planFile?: unknown;
  /** The case must fail: the checkpoint cannot be fingerprinted. */
  error?: string;
  expected?: Expected;
}

export interface Vectors {
  about: string;
  models: Record<string, { copyOf: string } | { synthetic: SyntheticModel }>;
  cases: VectorCase[];
}

export function readVectors(): Vectors {
  return JSON.parse(readFileSync(join(VECTORS_DIR, 'cases.json'), 'utf8')) as Vectors;
}

/** Data byte p holds 0, except that every p divisible by 4096 starts u64le(p / 4096 + 1). */
function writeSynthetic(dir: string, m: SyntheticModel): void {
  writeFileSync(join(dir, 'config.json'), JSON.stringify(m.config));
  const header: Record<string, unknown> = {};
  let cursor = 0;
  for (const [name, shape] of m.tensors) {
    const bytes = (shape.reduce((a, b) => a * b, 1) * dtypeBits(m.dtype)) / 8;
    header[name] = { dtype: m.dtype, shape, data_offsets: [cursor, cursor + bytes] };
    cursor += bytes;
  }
  const json = Buffer.from(JSON.stringify(header));
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(json.length));
  const fd = openSync(join(dir, m.file), 'w');
  try {
    writeSync(fd, Buffer.concat([prefix, json]), 0, 8 + json.length, 0);
    ftruncateSync(fd, 8 + json.length + cursor);
    const stamp = Buffer.alloc(8);
    for (let p = 0; p < cursor; p += 4096) {
      stamp.writeBigUInt64LE(BigInt(p / 4096 + 1));
      writeSync(fd, stamp, 0, Math.min(8, cursor - p), 8 + json.length + p);
    }
  } finally {
    closeSync(fd);
  }
}

function tensorStart(path: string, tensor: string): { begin: number; end: number } {
  const bytes = readFileSync(path);
  const n = Number(bytes.readBigUInt64LE(0));
  const entry = (JSON.parse(bytes.subarray(8, 8 + n).toString('utf8')) as Record<string, { data_offsets: [number, number] }>)[tensor];
  if (!entry) throw new Error(`vector recipe: no tensor ${tensor} in ${path}`);
  return { begin: 8 + n + entry.data_offsets[0], end: 8 + n + entry.data_offsets[1] };
}

/** Builds the case's model directory under `root`; returns it and the plan file's path, if any. */
export function materialize(vectors: Vectors, c: VectorCase, root: string): { modelDir: string; planFile?: string } {
  const modelDir = join(root, 'model');
  const model = vectors.models[c.model];
  if (!model) throw new Error(`vector case ${c.name}: no model ${c.model}`);
  if ('copyOf' in model) cpSync(join(repoRoot, model.copyOf), modelDir, { recursive: true });
  else {
    mkdirSync(modelDir, { recursive: true });
    writeSynthetic(modelDir, model.synthetic);
  }
  for (const m of c.mutations ?? []) {
    if (m.op === 'config') {
      const path = join(modelDir, 'config.json');
      writeFileSync(path, JSON.stringify({ ...JSON.parse(readFileSync(path, 'utf8')), ...m.set }));
    } else if (m.op === 'truncate') {
      const path = join(modelDir, m.file);
      truncateSync(path, statSync(path).size - m.drop);
    } else {
      const path = join(modelDir, m.file);
      const { begin, end } = tensorStart(path, m.tensor);
      const fd = openSync(path, 'r+');
      try {
        writeSync(fd, Buffer.alloc(m.length, m.byte), 0, m.length, m.offset >= 0 ? begin + m.offset : end + m.offset);
      } finally {
        closeSync(fd);
      }
    }
  }
  if (c.planFile === undefined) return { modelDir };
  const planFile = join(root, 'plan.json');
  writeFileSync(planFile, JSON.stringify(c.planFile));
  return { modelDir, planFile };
}
