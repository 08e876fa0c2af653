// A small tensor-parallel planner for the GPU benchmarks and checks: Llama-style names decide
// the split (row-parallel o_proj/down_proj on dim 1, column-parallel q/k/v/gate/up and the
// embedding on dim 0, everything else replicated), one arena segment per rank, tensors at
// 256-byte offsets. It needs no config.json and no worker pool, so it runs on a GPU host with
// only dist/ and the addon; the daemon's own planner lives in src/checkpoint.
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { parseSafetensors } from '../../dist/src/checkpoint/parseSafetensors.js';

const ALIGN = 256;
const alignUp = (n) => Math.ceil(n / ALIGN) * ALIGN;

/** The dim a tensor is split on, or null when every rank holds all of it. */
export function splitDim(name) {
  if (/(o_proj|down_proj)\.weight$/.test(name)) return 1;
  if (/(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$|embed_tokens\.weight$/.test(name)) return 0;
  return null;
}

export async function readCheckpoint(dir) {
  const paths = readdirSync(dir).filter((f) => f.endsWith('.safetensors')).sort().map((f) => join(dir, f));
  if (!paths.length) throw new Error(`no .safetensors files in ${dir}`);
  return Promise.all(paths.map((p) => parseSafetensors(p)));
}

/**
 * Rank `rank` of `tp`: { files, ops, segmentBytes, payloadBytes, tensors }. Each tensor entry
 * says where it came from and where it lands, for the checks in test/gpu.
 */
export function planRank(headers, tp, rank) {
  const ops = [];
  const tensors = [];
  let offset = 0;
  let payloadBytes = 0;
  headers.forEach((h, file) => {
    for (const t of h.tensors) {
      const total = t.end - t.begin;
      const dim = tp > 1 ? splitDim(t.name) : null;
      let op;
      if (dim === null) {
        op = { file, segment: 0, srcOffset: t.begin, dstOffset: offset, rows: 1, rowBytes: total, srcPitch: 0 };
      } else if (dim === 0) {
        const bytes = total / tp;
        op = { file, segment: 0, srcOffset: t.begin + rank * bytes, dstOffset: offset, rows: 1, rowBytes: bytes, srcPitch: 0 };
      } else {
        const rows = t.shape[0];
        const pitch = total / rows;
        const rowBytes = pitch / tp;
        op = { file, segment: 0, srcOffset: t.begin + rank * rowBytes, dstOffset: offset, rows, rowBytes, srcPitch: pitch };
      }
      const bytes = op.rows * op.rowBytes;
      if (!Number.isInteger(bytes)) throw new Error(`${t.name} ${JSON.stringify(t.shape)} does not split ${tp} ways`);
      ops.push(op);
      tensors.push({ name: t.name, path: h.path, begin: t.begin, end: t.end, shape: t.shape, dtype: t.dtype, dim, tp, rank, offset, bytes });
      payloadBytes += bytes;
      offset = alignUp(offset + bytes);
    }
  });
  return { files: headers.map((h) => h.path), ops, segmentBytes: offset, payloadBytes, tensors };
}
