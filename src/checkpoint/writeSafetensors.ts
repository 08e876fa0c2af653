// A safetensors writer for tests, benchmarks and the example generator. It writes what the
// reference crate writes (8-byte little-endian header length, JSON header padded with spaces to
// a multiple of 8 bytes, tensor data contiguous in header order) so that files made here are
// also readable by `safetensors` in Python.

import { open } from 'node:fs/promises';
import { CheckpointError } from '../errors.js';
import { bytesForElements, type SafetensorsDtype } from './dtypes.js';

export interface TensorToWrite {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /**
   * Little-endian element bytes. Left out, the tensor's bytes are zeros and the file is sparse,
   * which lets benchmarks make checkpoints with large shapes without writing their data.
   */
  data?: Uint8Array;
}

export interface EncodedHeader {
  /** The 8-byte length followed by the padded JSON header: the first bytes of the file. */
  header: Buffer;
  /** Per tensor, in input order, its [begin, end) inside the data section. */
  offsets: Array<[number, number]>;
  /** Size of the data section. */
  dataBytes: number;
}

/** Lays the tensors out in the order given; callers that want the crate's order sort first. */
export function encodeSafetensorsHeader(tensors: TensorToWrite[], metadata?: Record<string, string>): EncodedHeader {
  // No prototype: a tensor named "__proto__" must become a key, not replace the prototype.
  const json = Object.create(null) as Record<string, unknown>;
  if (metadata) json.__metadata__ = metadata;
  const offsets: Array<[number, number]> = [];
  let cursor = 0;
  for (const t of tensors) {
    if (t.name === '__metadata__' || Object.hasOwn(json, t.name)) {
      throw new CheckpointError('E_ST_WRITE_NAME', `cannot write tensor "${t.name}": the name is reserved or already used in this file; give each tensor a unique name`);
    }
    const elements = t.shape.reduce((a, b) => a * b, 1);
    const bytes = bytesForElements(t.dtype, elements);
    if (bytes === null) {
      throw new CheckpointError('E_ST_WRITE_SIZE', `cannot write tensor "${t.name}": ${elements} ${t.dtype} elements do not fill whole bytes; use an element count that does`);
    }
    if (t.data && t.data.byteLength !== bytes) {
      throw new CheckpointError('E_ST_WRITE_SIZE', `cannot write tensor "${t.name}": shape [${t.shape}] of ${t.dtype} needs ${bytes} bytes but ${t.data.byteLength} were given`);
    }
    json[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [cursor, cursor + bytes] };
    offsets.push([cursor, cursor + bytes]);
    cursor += bytes;
  }
  let text = JSON.stringify(json);
  const length = Buffer.byteLength(text);
  text += ' '.repeat((8 - (length % 8)) % 8);
  const body = Buffer.from(text, 'utf8');
  const header = Buffer.alloc(8 + body.length);
  header.writeBigUInt64LE(BigInt(body.length), 0);
  body.copy(header, 8);
  return { header, offsets, dataBytes: cursor };
}

export async function writeSafetensors(path: string, tensors: TensorToWrite[], metadata?: Record<string, string>): Promise<void> {
  const { header, offsets, dataBytes } = encodeSafetensorsHeader(tensors, metadata);
  const fh = await open(path, 'w');
  try {
    await fh.write(header, 0, header.length, 0);
    for (let i = 0; i < tensors.length; i++) {
      const data = tensors[i]!.data;
      if (data && data.byteLength > 0) await fh.write(data, 0, data.byteLength, header.length + offsets[i]![0]);
    }
    // Extends the file over tensors given without data; the hole reads back as zeros.
    await fh.truncate(header.length + dataBytes);
  } finally {
    await fh.close();
  }
}
