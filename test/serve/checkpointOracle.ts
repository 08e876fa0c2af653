// What each rank of a Llama checkpoint must hold, computed straight from the safetensors files
// with Megatron/vLLM's rules and nothing from the planner: column-parallel projections and the
// vocab-parallel embedding/head split on dim 0, row-parallel ones on dim 1, norms replicated.
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const ELEMENT_BYTES: Record<string, number> = { BF16: 2, F16: 2, F32: 4, F64: 8, I64: 8, I32: 4, U8: 1, I8: 1 };

export interface ExpectedTensor {
  dtype: string;
  shape: number[];
  bytes: Buffer;
  sha256: string;
}

function ruleFor(name: string): 'full' | 0 | 1 {
  if (/\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$/.test(name)) return 0;
  if (/\.(o_proj|down_proj)\.weight$/.test(name)) return 1;
  if (/(embed_tokens|lm_head)\.weight$/.test(name)) return 0;
  return 'full';
}

/** Every tensor of every safetensors file in `modelDir`, as stored. */
export function readCheckpoint(modelDir: string): Map<string, { dtype: string; shape: number[]; data: Buffer }> {
  const out = new Map<string, { dtype: string; shape: number[]; data: Buffer }>();
  for (const file of readdirSync(modelDir).filter((f) => f.endsWith('.safetensors')).sort()) {
    const buf = readFileSync(join(modelDir, file));
    const headerLen = Number(buf.readBigUInt64LE(0));
    const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
    const base = 8 + headerLen;
    for (const [name, t] of Object.entries(header)) {
      if (name === '__metadata__') continue;
      out.set(name, { dtype: t.dtype, shape: t.shape, data: buf.subarray(base + t.data_offsets[0], base + t.data_offsets[1]) });
    }
  }
  return out;
}

export function expectedRank(modelDir: string, tp: number, rank: number): Map<string, ExpectedTensor> {
  const out = new Map<string, ExpectedTensor>();
  for (const [name, t] of readCheckpoint(modelDir)) {
    const rule = ruleFor(name);
    const el = ELEMENT_BYTES[t.dtype]!;
    let shape = t.shape;
    let bytes = t.data;
    if (rule === 0) {
      const rows = t.shape[0]! / tp;
      const rowBytes = (t.data.length / t.shape[0]!);
      shape = [rows, ...t.shape.slice(1)];
      bytes = t.data.subarray(rank * rows * rowBytes, (rank + 1) * rows * rowBytes);
    } else if (rule === 1) {
      const [rows, cols] = t.shape as [number, number];
      const part = cols / tp;
      shape = [rows, part];
      const pieces: Buffer[] = [];
      for (let r = 0; r < rows; r++) {
        const start = (r * cols + rank * part) * el;
        pieces.push(t.data.subarray(start, start + part * el));
      }
      bytes = Buffer.concat(pieces);
    }
    out.set(name, { dtype: t.dtype, shape, bytes, sha256: createHash('sha256').update(bytes).digest('hex') });
  }
  return out;
}
