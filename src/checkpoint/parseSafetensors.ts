// Reads and validates the header of one safetensors file without touching its data. The rules
// and their order are the reference crate's (safetensors/src/tensor.rs, read_metadata and
// Metadata::validate), so a file accepted here is one the Python and Rust loaders accept too,
// and a file they reject is rejected here before minutes of loading are spent. Each rule has
// its own stable error code.

import { createHash } from 'node:crypto';
import type { FileHandle } from 'node:fs/promises';
import { CheckpointError, type ErrorCode } from '../errors.js';
import { DTYPES, isDtype, tensorBits, type SafetensorsDtype } from './dtypes.js';
import { findDuplicateJsonKey } from './findDuplicateJsonKey.js';
import { openRegularFile } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';

/** The crate's MAX_HEADER_SIZE. */
export const MAX_HEADER_BYTES = 100_000_000;

const U64_LIMIT = 1n << 64n;

export interface SafetensorsTensor {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** Absolute byte offsets in the file (data_offsets plus the header size). */
  begin: number;
  end: number;
}

export interface SafetensorsHeader {
  path: string;
  fileSize: number;
  /** Byte offset of the data section: 8 + the header length. */
  dataStart: number;
  /** In data order. */
  tensors: SafetensorsTensor[];
  /** `__metadata__`, or null when the header has none. */
  metadata: Record<string, string> | null;
  /** sha256 (hex) of the file's first dataStart bytes: the length prefix and the header exactly as stored. */
  headerSha256: string;
}

function fail(code: ErrorCode, path: string, message: string, details: Record<string, unknown> = {}): never {
  throw new CheckpointError(code, `${path}: ${message}`, { file: path, ...details });
}

async function readExactly(fh: FileHandle, path: string, buf: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < buf.length) {
    let bytesRead: number;
    try {
      ({ bytesRead } = await fh.read(buf, done, buf.length - done, position + done));
    } catch (err) {
      fail('E_ST_IO', path, `cannot read the header: ${(err as Error).message}`);
    }
    if (bytesRead === 0) fail('E_ST_IO', path, `the file ended while reading its header at byte ${position + done}; it changed while being read, or is on a failing filesystem`);
    done += bytesRead;
  }
}

export async function parseSafetensors(path: string): Promise<SafetensorsHeader> {
  let fh: FileHandle;
  let size: number;
  try {
    ({ fh, size } = await openRegularFile(path));
  } catch (err) {
    if (err instanceof CheckpointError) throw err;
    fail('E_ST_IO', path, `cannot open: ${(err as Error).message}`);
  }
  try {
    if (size < 8) {
      fail('E_ST_TOO_SMALL', path, `the file is ${size} bytes; a safetensors file starts with an 8-byte header length. It is truncated or not a safetensors file: download it again`);
    }
    const prefix = Buffer.alloc(8);
    await readExactly(fh, path, prefix, 0);
    const headerLength = checkHeaderLength(path, prefix.readBigUInt64LE(0), size);
    const header = Buffer.alloc(headerLength);
    await readExactly(fh, path, header, 8);
    return validateHeader(path, size, prefix, header);
  } finally {
    await fh.close();
  }
}

function checkHeaderLength(path: string, n: bigint, fileSize: number): number {
  if (n > BigInt(MAX_HEADER_BYTES)) {
    fail('E_ST_HEADER_TOO_LARGE', path, `the header length field says ${n} bytes, over the ${MAX_HEADER_BYTES}-byte limit of the safetensors format; the file is corrupt or not a safetensors file`, { headerLength: n.toString() });
  }
  if (n + 8n > BigInt(fileSize)) {
    fail('E_ST_HEADER_TRUNCATED', path, `the header length field says ${n} bytes but the file has only ${fileSize - 8} bytes after it; the file is truncated: download it again`, { headerLength: Number(n), fileSize });
  }
  return Number(n);
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A u64 from the header, as a number: values past 2^53 cannot be exact here and describe no real file. */
function headerInteger(path: string, tensor: string, field: string, v: unknown, code: ErrorCode): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
    fail(code, path, `tensor "${tensor}": ${field} holds ${JSON.stringify(v)}, which is not a non-negative integer; the header is corrupt: export or download the file again`, { tensor });
  }
  if (!Number.isSafeInteger(v)) {
    fail('E_ST_OVERFLOW', path, `tensor "${tensor}": ${field} holds ${v}, beyond 2^53-1; no file that size exists, so the header is corrupt: export or download the file again`, { tensor });
  }
  return v;
}

interface Entry {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  begin: number;
  end: number;
}

function readEntry(path: string, name: string, value: unknown): Entry {
  if (!isPlainObject(value)) {
    fail('E_ST_BAD_ENTRY', path, `tensor "${name}": its header entry is ${JSON.stringify(value)}, not an object with dtype, shape and data_offsets`, { tensor: name });
  }
  const { dtype, shape, data_offsets: offsets } = value;
  if (typeof dtype !== 'string') {
    fail('E_ST_BAD_ENTRY', path, `tensor "${name}": dtype is ${JSON.stringify(dtype)}, not a string`, { tensor: name });
  }
  if (!isDtype(dtype)) {
    fail('E_ST_UNKNOWN_DTYPE', path, `tensor "${name}": dtype "${dtype}" is not a safetensors dtype (known: ${DTYPES.join(', ')}); the file was written by an incompatible tool`, { tensor: name, dtype });
  }
  if (!Array.isArray(shape)) {
    fail('E_ST_BAD_SHAPE', path, `tensor "${name}": shape is ${JSON.stringify(shape)}, not an array of integers`, { tensor: name });
  }
  const dims = shape.map((d, i) => headerInteger(path, name, `shape[${i}]`, d, 'E_ST_BAD_SHAPE'));
  if (!Array.isArray(offsets) || offsets.length !== 2) {
    fail('E_ST_BAD_OFFSETS', path, `tensor "${name}": data_offsets is ${JSON.stringify(offsets)}, not a [begin, end] pair`, { tensor: name });
  }
  const begin = headerInteger(path, name, 'data_offsets[0]', offsets[0], 'E_ST_BAD_OFFSETS');
  const end = headerInteger(path, name, 'data_offsets[1]', offsets[1], 'E_ST_BAD_OFFSETS');
  return { name, dtype, shape: dims, begin, end };
}

/** The crate's size check: element count and bit count computed without wrapping u64. */
function checkSize(path: string, e: Entry): void {
  // Every dtype is at least one bit wide, so an element count past u64 is a bit count past it too.
  const bits = tensorBits(e.dtype, e.shape);
  if (bits >= U64_LIMIT) {
    fail('E_ST_OVERFLOW', path, `tensor "${e.name}": shape [${e.shape}] of ${e.dtype} has more bits than a u64 can count; the header is corrupt: export or download the file again`, { tensor: e.name });
  }
  if (bits % 8n !== 0n) {
    fail('E_ST_MISALIGNED', path, `tensor "${e.name}": shape [${e.shape}] of ${e.dtype} is ${bits} bits, not a whole number of bytes; sub-byte tensors must fill their last byte`, { tensor: e.name });
  }
  const bytes = bits / 8n;
  if (bytes !== BigInt(e.end - e.begin)) {
    fail('E_ST_SIZE_MISMATCH', path, `tensor "${e.name}": shape [${e.shape}] of ${e.dtype} needs ${bytes} bytes but data_offsets [${e.begin}, ${e.end}] span ${e.end - e.begin}; the header is corrupt: export or download the file again`, { tensor: e.name });
  }
}

function readMetadata(path: string, value: unknown): Record<string, string> | null {
  // The crate reads __metadata__ as Option<HashMap<String, String>>: null is allowed.
  if (value === null || value === undefined) return null;
  if (!isPlainObject(value)) {
    fail('E_ST_BAD_METADATA', path, `__metadata__ is ${JSON.stringify(value)}, not an object of strings`);
  }
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') {
      fail('E_ST_BAD_METADATA', path, `__metadata__["${k}"] is ${JSON.stringify(v)}; every metadata value must be a string`, { key: k });
    }
  }
  return value as Record<string, string>;
}

function validateHeader(path: string, fileSize: number, prefix: Buffer, header: Buffer): SafetensorsHeader {
  let text: string;
  try {
    // ignoreBOM keeps a byte-order mark in the text, so JSON.parse rejects it as the crate does.
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(header);
  } catch {
    fail('E_ST_HEADER_UTF8', path, 'the header is not valid UTF-8; the file is corrupt or not a safetensors file');
  }
  let json: unknown;
  try {
    json = parseBoundedJson(text);
  } catch (err) {
    fail('E_ST_HEADER_JSON', path, `the header is not valid JSON (${(err as Error).message}); the file is corrupt or not a safetensors file`);
  }
  if (!isPlainObject(json)) {
    fail('E_ST_HEADER_NOT_OBJECT', path, `the header is a JSON ${Array.isArray(json) ? 'array' : typeof json}, not an object mapping tensor names to entries`);
  }
  const dup = findDuplicateJsonKey(text);
  if (dup) {
    if (dup.path.length === 0) {
      fail('E_ST_DUPLICATE_TENSOR', path, `tensor "${dup.key}" appears twice in the header; readers would silently pick one of its two byte ranges. Rewrite the file with unique names`, { tensor: dup.key });
    }
    fail('E_ST_DUPLICATE_KEY', path, `key "${dup.key}" appears twice inside "${dup.path.join('.')}" in the header; the header is corrupt: export or download the file again`, { key: dup.key });
  }

  const metadata = readMetadata(path, json.__metadata__);
  const entries: Entry[] = [];
  for (const [name, value] of Object.entries(json)) {
    if (name !== '__metadata__') entries.push(readEntry(path, name, value));
  }
  // The crate sorts by offsets and then requires each tensor to start where the previous ended.
  entries.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  for (const e of entries) {
    if (e.begin !== cursor || e.end < e.begin) {
      const why = e.end < e.begin ? 'ends before it begins'
        : e.begin > cursor ? `leaves a gap: the previous tensor ends at ${cursor}`
        : `overlaps the previous tensor, which ends at ${cursor}`;
      fail('E_ST_OFFSETS', path, `tensor "${e.name}": data_offsets [${e.begin}, ${e.end}] ${why}; tensors must tile the data section from 0 with no gaps or overlaps`, { tensor: e.name });
    }
    checkSize(path, e);
    cursor = e.end;
  }
  const dataStart = 8 + header.length;
  const dataBytes = fileSize - dataStart;
  if (cursor > dataBytes) {
    const last = entries[entries.length - 1]!;
    fail('E_ST_DATA_TRUNCATED', path, `tensor "${last.name}" ends at data byte ${cursor} but the file holds only ${dataBytes} data bytes; the file is truncated: download it again`, { tensor: last.name, fileSize });
  }
  if (cursor < dataBytes) {
    fail('E_ST_TRAILING_BYTES', path, `the tensors end at data byte ${cursor} but the file holds ${dataBytes} data bytes; ${dataBytes - cursor} trailing bytes belong to no tensor (the format forbids them: the file is corrupt or was appended to)`, { fileSize });
  }

  const hash = createHash('sha256');
  hash.update(prefix);
  hash.update(header);
  return {
    path,
    fileSize,
    dataStart,
    tensors: entries.map((e) => ({ name: e.name, dtype: e.dtype, shape: e.shape, begin: dataStart + e.begin, end: dataStart + e.end })),
    metadata,
    headerSha256: hash.digest('hex'),
  };
}
