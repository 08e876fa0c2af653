import type { CopyOp } from '../../src/checkpoint/types.js';

/** The bytes an op must leave in its segment, computed the plain way. */
export function expectedBytes(file: Buffer, op: CopyOp): Buffer {
  const rows = Array.from({ length: op.rows }, (_, r) => file.subarray(op.srcOffset + r * op.srcPitch, op.srcOffset + r * op.srcPitch + op.rowBytes));
  return Buffer.concat(rows);
}
