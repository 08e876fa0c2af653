// A manifest's tensors as columns (docs/spec/manifest-columns.md): one array per field instead of
// one object per tensor. At 50k tensors the objects are 7 MB of JSON that a Python client took
// 0.2 s to decode (most of a first attach); the columns are about half the bytes and decode in a
// fraction of the time, since a list of numbers is far cheaper to build than a dict per tensor.
// The schema is protocol.ts's; the daemon encodes (encodedManifest.ts), the TypeScript client decodes (weightdClient.ts);
// the Python client's twin is weightd_client/columns.py, and both read test/vectors/manifest-columns.json.
import { ProtocolError } from '../errors.js';
import type { TensorColumns, TensorMeta } from './protocol.js';

/** The index of `key` in `table`, added at its end on first use. */
function indexIn<T>(index: Map<string, number>, table: T[], key: string, value: T): number {
  let k = index.get(key);
  if (k === undefined) {
    k = table.push(value) - 1;
    index.set(key, k);
  }
  return k;
}

/** The columns of `tensors`, in their order; dtypes and shapes listed in order of first use. */
export function toColumns(tensors: readonly TensorMeta[]): TensorColumns {
  const out: TensorColumns = { name: [], dtypes: [], dtype: [], shapes: [], shape: [], segment: [], offset: [], bytes: [] };
  const dtypeIndex = new Map<string, number>();
  const shapeIndex = new Map<string, number>();
  for (const t of tensors) {
    out.name.push(t.name);
    out.dtype.push(indexIn(dtypeIndex, out.dtypes, t.dtype, t.dtype));
    out.shape.push(indexIn(shapeIndex, out.shapes, t.shape.join(','), t.shape));
    out.segment.push(t.segment);
    out.offset.push(t.offset);
    out.bytes.push(t.bytes);
  }
  return out;
}

function bad(message: string): ProtocolError {
  return new ProtocolError('E_BAD_MANIFEST', `manifest columns: ${message}; the daemon's reply is malformed (upgrade the client or the daemon, or load from disk)`);
}

/** The tensors the columns hold, checked for consistency (schema-checked columns in). */
export function fromColumns(c: TensorColumns): TensorMeta[] {
  const n = c.name.length;
  for (const key of ['dtype', 'shape', 'segment', 'offset', 'bytes'] as const) {
    if (c[key].length !== n) throw bad(`"${key}" has ${c[key].length} entries but "name" has ${n}`);
  }
  const out: TensorMeta[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const dtype = c.dtypes[c.dtype[i]!];
    if (dtype === undefined) throw bad(`tensor ${JSON.stringify(c.name[i])} has dtype index ${c.dtype[i]}, but "dtypes" has ${c.dtypes.length}`);
    const shape = c.shapes[c.shape[i]!];
    if (shape === undefined) throw bad(`tensor ${JSON.stringify(c.name[i])} has shape index ${c.shape[i]}, but "shapes" has ${c.shapes.length}`);
    out[i] = { name: c.name[i]!, dtype, shape: [...shape], segment: c.segment[i]!, offset: c.offset[i]!, bytes: c.bytes[i]! };
  }
  return out;
}
