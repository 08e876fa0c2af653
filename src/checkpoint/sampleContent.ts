// The `content` fingerprint field's sample: which bytes of every tensor are hashed, and the
// per-file digest over them. docs/spec/fingerprint.md is the rule, byte for byte; the Python
// client (clients/python/weightd_client/fingerprint.py) implements the same rule, and the
// vectors in test/vectors/fingerprint hold the two together.
//
// The sample has a fixed size however large the checkpoint is (a global block budget), and a
// fixed per-tensor part however many tensors it has, so a 100 GB checkpoint costs the same few
// thousand reads of the page cache as a 10 GB one.

import { closeSync, readSync } from 'node:fs';
import { createRequire } from 'node:module';
import { CheckpointError } from '../errors.js';
import { openRegularFile, openRegularFileSync } from '../files/openRegularFile.js';

/** Bytes hashed at each end of every tensor (all of a tensor of at most twice this). */
export const SAMPLE_EDGE_BYTES = 128;
/** Size of one interior block. */
export const SAMPLE_BLOCK_BYTES = 4096;
/** Interior blocks over the whole checkpoint, shared out by tensor size. */
export const SAMPLE_BLOCK_BUDGET = 4096;
/** A checkpoint with at most this many data bytes is hashed whole. */
export const SAMPLE_WHOLE_LIMIT = SAMPLE_BLOCK_BUDGET * SAMPLE_BLOCK_BYTES;
/**
 * Sampled ranges this close together are read with one call. Only a read's count matters
 * once the page cache holds the file; copying 4 KiB costs less than a system call.
 */
const MERGE_GAP_BYTES = 4096;

/**
 * fileContentDigest made elsewhere than on this thread: a daemon's, by the addon on libuv
 * threads (src/native/sampleDigest.ts), so that planning starts no worker thread to sample.
 */
export type FileSampler = (path: string, spans: readonly number[], totalDataBytes: number, dataBefore: number) => Promise<string>;

/**
 * The sampled ranges of one file, as flat [begin, end, begin, end, ...] absolute offsets in
 * ascending order and disjoint. `spans` are the file's tensors as [begin, end) pairs in data
 * order; `totalDataBytes` is the sum of every tensor's bytes over all files of the checkpoint,
 * `dataBefore` that sum over the files before this one.
 */
export function sampleRanges(spans: readonly number[], totalDataBytes: number, dataBefore = 0): number[] {
  const out: number[] = [];
  const push = (b: number, e: number): void => {
    if (e <= b) return;
    // Adjacent ranges (one tensor's tail, the next one's head) are one range: the hashed bytes
    // are the same, and the spec then reads as a list of disjoint ranges.
    if (out.length && out[out.length - 1] === b) out[out.length - 1] = e;
    else out.push(b, e);
  };
  const whole = totalDataBytes <= SAMPLE_WHOLE_LIMIT;
  const budget = BigInt(SAMPLE_BLOCK_BUDGET);
  const total = BigInt(Math.max(totalDataBytes, 1));
  // Tensor t gets the blocks of the budget that fall in its share of the checkpoint's data:
  // floor(B * (G + n) / D) - floor(B * G / D), G being the data before it. The shares add up to
  // the whole budget however many tensors share it, where a per-tensor floor(B * n / D) would
  // give nothing to each of 40,000 small tensors.
  let before = BigInt(dataBefore);
  for (let i = 0; i < spans.length; i += 2) {
    const begin = spans[i]!;
    const end = spans[i + 1]!;
    const n = end - begin;
    const after = before + BigInt(n);
    // Exact integer arithmetic: a double's rounding could move a block by a byte on one side.
    const k = Number((budget * after) / total - (budget * before) / total);
    before = after;
    if (whole || n <= 2 * SAMPLE_EDGE_BYTES) {
      push(begin, end);
      continue;
    }
    const a = begin + SAMPLE_EDGE_BYTES;
    const z = end - SAMPLE_EDGE_BYTES;
    const m = z - a;
    push(begin, a);
    if (k * SAMPLE_BLOCK_BYTES >= m) {
      push(a, z);
    } else {
      const bm = BigInt(m);
      const bk = BigInt(k);
      for (let j = 0; j < k; j++) {
        const start = a + Number((BigInt(j) * bm) / bk);
        push(start, start + SAMPLE_BLOCK_BYTES);
      }
    }
    push(z, end);
  }
  return out;
}

/** A file's content digest: xxh3-128 of its sampled bytes, concatenated in file order (32 hex digits). */
export function fileContentDigest(path: string, spans: readonly number[], totalDataBytes: number, dataBefore: number): string {
  const ranges = sampleRanges(spans, totalDataBytes, dataBefore);
  let sampled = 0;
  for (let i = 0; i < ranges.length; i += 2) sampled += ranges[i + 1]! - ranges[i]!;
  const sample = Buffer.allocUnsafe(sampled);
  // Synchronous reads: this runs on a pool thread (or on a tiny checkpoint), and a read through
  // the thread pool would cost ten times a read of the page cache.
  let fd: number;
  try {
    // The one regular-file rule: a shard swapped for a FIFO since it was planned must not block this thread.
    ({ fd } = openRegularFileSync(path));
  } catch (err) {
    throw cannotOpen(path, err);
  }
  try {
    let at = 0;
    let scratch = Buffer.alloc(0);
    for (let i = 0; i < ranges.length;) {
      // One read covers every range whose gap to the previous is small.
      let j = i + 2;
      while (j < ranges.length && ranges[j]! - ranges[j - 1]! <= MERGE_GAP_BYTES) j += 2;
      const from = ranges[i]!;
      const to = ranges[j - 1]!;
      if (scratch.length < to - from) scratch = Buffer.allocUnsafe(Math.max(to - from, scratch.length * 2));
      readFully(fd, path, scratch, to - from, from);
      for (let r = i; r < j; r += 2) at += scratch.copy(sample, at, ranges[r]! - from, ranges[r + 1]! - from);
      i = j;
    }
  } finally {
    closeSync(fd);
  }
  return xxh3().xxh128(sample).toString(16).padStart(32, '0');
}

let xxh3Module: typeof import('@node-rs/xxhash').xxh3 | undefined;

/**
 * @node-rs/xxhash, loaded on first use: a native module, whose load (dlopen and its init) was
 * 4-6 ms of every daemon start on the development VM, where a daemon hashes its samples in the
 * addon (src/native/sampleDigest.ts) and only a checkpoint of at most SAMPLE_WHOLE_LIMIT bytes, a
 * header worker or a client's command reads them here (bench/RESULTS.md, issue 33).
 */
function xxh3(): typeof import('@node-rs/xxhash').xxh3 {
  return (xxh3Module ??= (createRequire(import.meta.url)('@node-rs/xxhash') as typeof import('@node-rs/xxhash')).xxh3);
}

/**
 * What reads a file's sampled `ranges` ([begin, end) pairs) from `fd` and hashes them as
 * fileContentDigest does, off this thread (the addon's sampleDigest): the digest, or where the
 * file ended, or which read failed and why.
 */
export type SampleReader = (fd: number, ranges: Float64Array, mergeGap: number) => Promise<{ digest?: string; endedAt?: number; failedAt?: number; reason?: string }>;

/** A FileSampler whose reads and hash are `read`'s: the file opened, and the errors worded, as fileContentDigest does. */
export function samplerWith(read: SampleReader): FileSampler {
  return async (path, spans, totalDataBytes, dataBefore) => {
    const ranges = sampleRanges(spans, totalDataBytes, dataBefore);
    let file;
    try {
      file = await openRegularFile(path);
    } catch (err) {
      throw cannotOpen(path, err);
    }
    try {
      const r = await read(file.fh.fd, Float64Array.from(ranges), MERGE_GAP_BYTES);
      if (r.digest !== undefined) return r.digest;
      if (r.endedAt !== undefined) throw endedEarly(path, r.endedAt);
      throw readFailed(path, r.failedAt!, r.reason!);
    } finally {
      await file.fh.close();
    }
  };
}

function cannotOpen(path: string, err: unknown): CheckpointError {
  if (err instanceof CheckpointError) return err;
  return new CheckpointError('E_ST_IO', `${path}: cannot open to sample its tensors: ${(err as Error).message}`, { file: path });
}

function readFailed(path: string, offset: number, reason: string): CheckpointError {
  return new CheckpointError('E_ST_IO', `${path}: cannot read tensor bytes at ${offset}: ${reason}`, { file: path });
}

function endedEarly(path: string, offset: number): CheckpointError {
  return new CheckpointError('E_ST_DATA_TRUNCATED', `${path}: the file ended at byte ${offset} while its tensors' bytes were sampled; it is shorter than its header says (truncated, or changed while being read): download it again`, { file: path, offset });
}

function readFully(fd: number, path: string, buf: Buffer, length: number, position: number): void {
  let done = 0;
  while (done < length) {
    let n: number;
    try {
      n = readSync(fd, buf, done, length - done, position + done);
    } catch (err) {
      throw readFailed(path, position + done, (err as Error).message);
    }
    if (n === 0) throw endedEarly(path, position + done);
    done += n;
  }
}
