// Device memory is copied out into one exactly sized ArrayBuffer, a view at a time: a typed
// array (and a Buffer) holds at most 4 GiB on Node 20, while an ArrayBuffer holds a whole
// tensor of any size (Qwen2.5-72B's embedding at tp=1 is 2.49 GB; the addon's old 2 GiB cap
// made copy() fail on it). Chunks also keep each native call, which holds the mapping's lock,
// short.

export const READ_CHUNK_BYTES = 1 << 30;

/** A new ArrayBuffer of `length` bytes, filled by `readInto(offset, view)` for each chunk, one after another. */
export async function readInChunks(
  length: number,
  readInto: (offset: number, view: Uint8Array) => Promise<void>,
  chunkBytes = READ_CHUNK_BYTES,
): Promise<ArrayBuffer> {
  const out = new ArrayBuffer(length);
  for (let at = 0; at < length; at += chunkBytes) await readInto(at, new Uint8Array(out, at, Math.min(chunkBytes, length - at)));
  return out;
}
