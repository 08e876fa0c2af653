// Typed-array views of tensors in a segment's bytes (docs/spec/dtypes.md). JavaScript has no
// 16-bit or 8-bit float arrays, so F16/BF16 come as Uint16Array and the F8 family as Uint8Array:
// the bits are exact, and the caller reinterprets them. Sub-byte dtypes (F4, F6_*) are packed bytes.
import { isDtype, type SafetensorsDtype } from '../checkpoint/dtypes.js';
import { ProtocolError } from '../errors.js';
import type { TensorMeta } from '../wire/protocol.js';

export type TensorArray =
  | Float64Array
  | Float32Array
  | Uint16Array
  | Int16Array
  | Int32Array
  | Uint32Array
  | BigInt64Array
  | BigUint64Array
  | Int8Array
  | Uint8Array;

type ArrayCtor = { new (buffer: ArrayBuffer, byteOffset: number, length: number): TensorArray; BYTES_PER_ELEMENT: number };

/** The dtypes that have a typed array of their own; every other safetensors dtype is a byte view. */
const VIEW: Partial<Record<SafetensorsDtype, ArrayCtor>> = {
  F64: Float64Array,
  F32: Float32Array,
  /** Complex64: interleaved (real, imaginary) float32 pairs. */
  C64: Float32Array,
  F16: Uint16Array,
  BF16: Uint16Array,
  I64: BigInt64Array,
  U64: BigUint64Array,
  I32: Int32Array,
  U32: Uint32Array,
  I16: Int16Array,
  U16: Uint16Array,
  I8: Int8Array,
  U8: Uint8Array,
  BOOL: Uint8Array,
};

function ctorFor(dtype: string): ArrayCtor {
  if (!isDtype(dtype)) {
    throw new ProtocolError('E_UNKNOWN_DTYPE', `tensor dtype ${JSON.stringify(dtype)} is not one this client knows; upgrade the client`, { dtype });
  }
  // F8_E4M3, F8_E5M2, F8_E8M0, the FNUZ variants, F4 and F6_*: byte views of the raw bits.
  return VIEW[dtype] ?? Uint8Array;
}

/** A typed array over `t`'s bytes at `base + t.offset` in `buffer`; no copy. */
export function tensorArray(t: TensorMeta, buffer: ArrayBuffer, base = 0): TensorArray {
  const Ctor = ctorFor(t.dtype);
  const start = base + t.offset;
  if (t.bytes % Ctor.BYTES_PER_ELEMENT !== 0 || start % Ctor.BYTES_PER_ELEMENT !== 0 || start + t.bytes > buffer.byteLength) {
    throw new ProtocolError(
      'E_BAD_MANIFEST',
      `tensor ${t.name} (${t.dtype}, ${t.bytes} bytes at offset ${t.offset}) does not fit its segment of ${buffer.byteLength} bytes with ${Ctor.BYTES_PER_ELEMENT}-byte elements; the daemon's manifest is inconsistent`,
      { tensor: t.name },
    );
  }
  return new Ctor(buffer, start, t.bytes / Ctor.BYTES_PER_ELEMENT);
}
