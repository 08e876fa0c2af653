// A manifest's tensors as packed binary columns (docs/spec/manifest-packed.md): the frame that
// follows a get_state reply asked for with `packed`. At 50k tensors a Python client spent a third
// of its first attach decoding and type-checking the JSON columns; packed, a numeric column is
// one copy of a C array and the names one split. The daemon encodes (encodedManifest.ts), the
// TypeScript client decodes (weightdClient.ts); the Python client's twin is
// weightd_client/packed_manifest.py, and both read test/vectors/manifest-packed.json.
import { ProtocolError } from '../errors.js';
import type { TensorMeta } from './protocol.js';
import { toColumns } from './tensorColumns.js';

const MAGIC = Buffer.from('WGTDPACK', 'latin1');
export const PACKED_VERSION = 1;
const HEADER_BYTES = 40;
/** What JSON and a double hold exactly: the most a u64 of the format may be. */
const MAX_U64 = Number.MAX_SAFE_INTEGER;
const TERMINATOR = '\0';

/** The sections' byte sizes and offsets of a manifest of these counts (spec §2). */
function layout(n: number, s: number, r: number, t: number, m: number) {
  const offset = HEADER_BYTES;
  const bytes = offset + 8 * n;
  const dims = bytes + 8 * n;
  const segment = dims + 8 * r;
  const shape = segment + 4 * n;
  const dtype = shape + 4 * n;
  const rank = dtype + 4 * n;
  const dtypes = rank + 4 * s;
  const names = dtypes + t;
  return { offset, bytes, dims, segment, shape, dtype, rank, dtypes, names, total: names + m };
}

/**
 * The packed bytes of `tensors`, or undefined for a manifest the format cannot carry (a name
 * holding U+0000, a number over 2^53 - 1): the daemon sends those as columns.
 */
export function toPacked(tensors: readonly TensorMeta[]): Buffer | undefined {
  const c = toColumns(tensors);
  const dims = c.shapes.flat();
  for (const column of [c.offset, c.bytes, dims]) if (column.some((v) => v > MAX_U64)) return undefined;
  if (c.segment.some((v) => v > 0xffffffff)) return undefined;
  // A name holding the terminator would read back as two.
  if (c.name.some((s) => s.includes(TERMINATOR)) || c.dtypes.some((s) => s.includes(TERMINATOR))) return undefined;
  const dtypeText = c.dtypes.length ? c.dtypes.join(TERMINATOR) + TERMINATOR : '';
  const nameText = c.name.length ? c.name.join(TERMINATOR) + TERMINATOR : '';
  const dtypeBytes = Buffer.byteLength(dtypeText, 'utf8');
  const nameBytes = Buffer.byteLength(nameText, 'utf8');
  const n = c.name.length;
  const at = layout(n, c.shapes.length, dims.length, dtypeBytes, nameBytes);
  const out = Buffer.alloc(at.total);
  const view = new DataView(out.buffer, out.byteOffset, out.length);
  MAGIC.copy(out, 0);
  [PACKED_VERSION, n, c.dtypes.length, c.shapes.length, dims.length, dtypeBytes, nameBytes, 0].forEach((v, i) => view.setUint32(8 + 4 * i, v, true));
  // Two u32 halves: exact for numbers up to 2^53 - 1, without a BigInt per number.
  const u64s = (start: number, values: readonly number[]) => {
    for (let i = 0; i < values.length; i++) {
      view.setUint32(start + 8 * i, values[i]! % 0x100000000, true);
      view.setUint32(start + 8 * i + 4, Math.floor(values[i]! / 0x100000000), true);
    }
  };
  const u32s = (start: number, values: readonly number[]) => {
    for (let i = 0; i < values.length; i++) view.setUint32(start + 4 * i, values[i]!, true);
  };
  u64s(at.offset, c.offset);
  u64s(at.bytes, c.bytes);
  u64s(at.dims, dims);
  u32s(at.segment, c.segment);
  u32s(at.shape, c.shape);
  u32s(at.dtype, c.dtype);
  u32s(at.rank, c.shapes.map((shape) => shape.length));
  out.write(dtypeText, at.dtypes, 'utf8');
  out.write(nameText, at.names, 'utf8');
  return out;
}

function bad(at: number, problem: string): ProtocolError {
  return new ProtocolError('E_BAD_MANIFEST', `packed manifest, at byte ${at}: ${problem}; the daemon's reply is malformed (upgrade the client or the daemon, or load from disk)`, { at });
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** The `count` strings of a section, each ending in a 0 byte (spec §3, check 7). */
function strings(buf: Buffer, start: number, size: number, count: number, what: string): string[] {
  const section = buf.subarray(start, start + size);
  let text: string;
  try {
    text = utf8.decode(section);
  } catch {
    throw bad(start, `the ${what} section is not valid UTF-8`);
  }
  if (size === 0 && count === 0) return [];
  if (size === 0 || section[size - 1] !== 0) throw bad(start + Math.max(size - 1, 0), `the ${what} section does not end with a 0 byte`);
  const out = text.split(TERMINATOR);
  out.pop();
  if (out.length !== count) throw bad(start, `the ${what} section holds ${out.length} names, not ${count}`);
  return out;
}

/** The tensors of a packed manifest, checked as docs/spec/manifest-packed.md §3 says, in its order. */
export function fromPacked(buf: Buffer): TensorMeta[] {
  if (buf.length < HEADER_BYTES) throw bad(0, `${buf.length} bytes is shorter than the ${HEADER_BYTES}-byte header`);
  if (!buf.subarray(0, 8).equals(MAGIC)) throw bad(0, 'it does not start with the magic "WGTDPACK"');
  const [version, n, d, s, r, t, m, reserved] = [0, 1, 2, 3, 4, 5, 6, 7].map((i) => buf.readUInt32LE(8 + 4 * i)) as [number, number, number, number, number, number, number, number];
  if (version !== PACKED_VERSION) throw bad(8, `version ${version} is not one this client reads (${PACKED_VERSION}); upgrade the client`);
  if (reserved !== 0) throw bad(36, 'the reserved field is not 0');
  const at = layout(n, s, r, t, m);
  if (at.total !== buf.length) throw bad(0, `the header's counts make ${at.total} bytes, but the manifest is ${buf.length}`);
  const u64s = (start: number, count: number): number[] => {
    const out = new Array<number>(count);
    for (let i = 0; i < count; i++) {
      const lo = buf.readUInt32LE(start + 8 * i);
      const hi = buf.readUInt32LE(start + 8 * i + 4);
      if (hi > 0x1fffff) throw bad(start + 8 * i, 'a number is above 2^53 - 1');
      out[i] = hi * 0x100000000 + lo;
    }
    return out;
  };
  const u32s = (start: number, count: number): number[] => {
    const out = new Array<number>(count);
    for (let i = 0; i < count; i++) out[i] = buf.readUInt32LE(start + 4 * i);
    return out;
  };
  const offset = u64s(at.offset, n);
  const bytes = u64s(at.bytes, n);
  const dims = u64s(at.dims, r);
  const segment = u32s(at.segment, n);
  const shape = u32s(at.shape, n);
  const dtype = u32s(at.dtype, n);
  const rank = u32s(at.rank, s);
  const outOfRange = (start: number, column: number[], limit: number, what: string) => {
    const i = column.findIndex((k) => k >= limit);
    if (i >= 0) throw bad(start + 4 * i, `tensor ${i}'s ${what} index ${column[i]} is out of range (${limit} ${what}s)`);
  };
  outOfRange(at.dtype, dtype, d, 'dtype');
  outOfRange(at.shape, shape, s, 'shape');
  if (rank.reduce((a, b) => a + b, 0) !== r) throw bad(at.rank, `the shapes' ranks do not add up to the header's ${r} dims`);
  const dtypes = strings(buf, at.dtypes, t, d, 'dtypes');
  const names = strings(buf, at.names, m, n, 'names');
  const shapes: number[][] = [];
  for (let k = 0, first = 0; k < s; first += rank[k]!, k++) shapes.push(dims.slice(first, first + rank[k]!));
  const out: TensorMeta[] = new Array(n);
  for (let i = 0; i < n; i++) {
    out[i] = { name: names[i]!, dtype: dtypes[dtype[i]!]!, shape: [...shapes[shape[i]!]!], segment: segment[i]!, offset: offset[i]!, bytes: bytes[i]! };
  }
  return out;
}
