// The closed dtype list of the safetensors format, as the reference crate (0.6+) defines it.
// Widths are in bits, not bytes, because F4 and the two F6 formats pack several elements into
// a byte: a tensor (or a slice of one) is only addressable when its total bit count is a whole
// number of bytes, which is the crate's MisalignedSlice rule. docs/spec/dtypes.md; the Python
// client's table (clients/python/weightd_client/tensors.py) is held to the same vectors.

export const DTYPE_BITS = {
  BOOL: 8,
  F4: 4,
  F6_E2M3: 6,
  F6_E3M2: 6,
  U8: 8,
  I8: 8,
  F8_E5M2: 8,
  F8_E4M3: 8,
  F8_E8M0: 8,
  F8_E4M3FNUZ: 8,
  F8_E5M2FNUZ: 8,
  I16: 16,
  U16: 16,
  F16: 16,
  BF16: 16,
  I32: 32,
  U32: 32,
  F32: 32,
  C64: 64,
  F64: 64,
  I64: 64,
  U64: 64,
} as const satisfies Record<string, number>;

export type SafetensorsDtype = keyof typeof DTYPE_BITS;

export const DTYPES = Object.keys(DTYPE_BITS) as SafetensorsDtype[];

export function isDtype(name: unknown): name is SafetensorsDtype {
  return typeof name === 'string' && Object.hasOwn(DTYPE_BITS, name);
}

export function dtypeBits(dtype: SafetensorsDtype): number {
  return DTYPE_BITS[dtype];
}

/**
 * Bytes that `elements` consecutive elements of `dtype` occupy, or null when they end in the
 * middle of a byte (only possible for the sub-byte dtypes). Callers pass counts already bounded
 * by a validated file size, so plain numbers stay exact.
 */
export function bytesForElements(dtype: SafetensorsDtype, elements: number): number | null {
  const bits = DTYPE_BITS[dtype];
  if (bits % 8 === 0) return elements * (bits / 8);
  const total = elements * bits;
  return total % 8 === 0 ? total / 8 : null;
}

/** The bits a tensor of `shape` occupies, counted exactly (a shape's product can pass 2^53). */
export function tensorBits(dtype: SafetensorsDtype, shape: readonly number[]): bigint {
  return shape.reduce((n, d) => n * BigInt(d), BigInt(DTYPE_BITS[dtype]));
}
