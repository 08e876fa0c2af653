// Parses every shard header of a checkpoint, and samples every shard's tensor bytes, in a
// piscina pool when there is enough work for it to pay. A 100k-tensor header is tens of MB of JSON: parsing, duplicate scanning and hashing
// it on the main thread would stall the daemon's sockets and state machine for that long.

import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import type { Piscina } from 'piscina';
import { deserializeError } from '../errors.js';
import type { ContentJob, HeaderResult, HeaderTask } from './headerWorker.js';
import { parseSafetensors, type SafetensorsHeader } from './parseSafetensors.js';
import { fileContentDigest, SAMPLE_WHOLE_LIMIT, type FileSampler } from './sampleContent.js';

/** Shards sampled at once by a `sampler` (sampleShards): each holds a descriptor while it reads. */
const SAMPLED_AT_ONCE = 8;

/**
 * Up to this many shards are parsed on the calling thread. Starting workers costs ~30-50 ms,
 * more than parsing a few ordinary headers (a 4-shard 8B model has ~300 tensors, well under
 * 1 ms of JSON), so a pool only pays for checkpoints with many or very large headers.
 */
export const INLINE_PARSE_MAX_FILES = 4;

/**
 * piscina, loaded when a pool is first made rather than with this module: loading it took ~11 ms
 * of every start (a 2026-12-06 CPU profile of a start on the VM), and most starts make no pool (a
 * few shards parse inline; a restart that adopts plans from the keeper's record, parsing nothing).
 */
function piscina(): typeof import('piscina') {
  return createRequire(import.meta.url)('piscina') as typeof import('piscina');
}

export function createHeaderPool(maxThreads = Math.max(1, Math.min(availableParallelism(), 8))): Piscina<HeaderTask, HeaderResult> {
  return new (piscina().Piscina)<HeaderTask, HeaderResult>({
    filename: new URL('./headerWorker.js', import.meta.url).href,
    minThreads: 0,
    maxThreads,
    idleTimeout: 1000,
    // With 'sync', an idle worker blocks in Atomics.wait and a late crash goes unseen.
    atomics: 'async',
  });
}

/**
 * Open files stay bounded whatever the shard count: inline, at most INLINE_PARSE_MAX_FILES; in
 * the pool, piscina queues the one-file tasks and a worker runs one at a time, so at most
 * maxThreads (8) headers are open at once.
 */
export async function parseShards(paths: string[], pool?: Piscina<HeaderTask, HeaderResult>): Promise<SafetensorsHeader[]> {
  if (!pool && paths.length <= INLINE_PARSE_MAX_FILES) return Promise.all(paths.map(parseSafetensors));
  const results = await runInPool(paths.map((p) => ({ paths: [p] })), paths.length, pool);
  return results.flatMap((r) => ('headers' in r ? r.headers : []));
}

/**
 * Each shard's content digest (sampleContent.ts), in file order. Sampling a real checkpoint
 * makes thousands of blocking reads, so it runs off this thread: by `sampler` where given (a
 * daemon's reads on libuv threads, src/native/sampleDigest.ts), else in the pool, but for a
 * checkpoint small enough to be hashed whole (a few MiB, tests and examples), sampled here in
 * less time than a worker takes to start. Starting the pool's workers cost more than the
 * sampling itself: an 8.56 GB, 4-shard checkpoint planned in 110-220 ms on H100 machines, most
 * of it four workers starting, and in 18-39 ms with the addon (bench/RESULTS.md, issue 33).
 */
export async function sampleShards(headers: SafetensorsHeader[], pool?: Piscina<HeaderTask, HeaderResult>, sampler?: FileSampler): Promise<string[]> {
  const dataBytes = headers.map((h) => h.tensors.reduce((s, t) => s + (t.end - t.begin), 0));
  const totalDataBytes = dataBytes.reduce((a, b) => a + b, 0);
  let dataBefore = 0;
  const jobs: ContentJob[] = headers.map((h, i) => {
    const job = { path: h.path, spans: h.tensors.flatMap((t) => [t.begin, t.end]), totalDataBytes, dataBefore };
    dataBefore += dataBytes[i]!;
    return job;
  });
  if (sampler) {
    const digests: string[] = new Array<string>(jobs.length);
    let next = 0;
    const lane = async (): Promise<void> => {
      for (let i = next++; i < jobs.length; i = next++) digests[i] = await sampler(jobs[i]!.path, jobs[i]!.spans, jobs[i]!.totalDataBytes, jobs[i]!.dataBefore);
    };
    await Promise.all(Array.from({ length: Math.min(SAMPLED_AT_ONCE, jobs.length) }, lane));
    return digests;
  }
  if (!pool && totalDataBytes <= SAMPLE_WHOLE_LIMIT) return jobs.map((j) => fileContentDigest(j.path, j.spans, j.totalDataBytes, j.dataBefore));
  const results = await runInPool(jobs.map((j) => ({ content: [j] })), jobs.length, pool);
  return results.flatMap((r) => ('digests' in r ? r.digests : []));
}

/** Runs one task per item, in `pool` or in a pool of its own; a task's failure or a dead worker rejects. */
async function runInPool(tasks: HeaderTask[], width: number, pool?: Piscina<HeaderTask, HeaderResult>): Promise<Array<Extract<HeaderResult, { ok: true }>>> {
  const own = pool ?? createHeaderPool(Math.max(1, Math.min(availableParallelism(), 8, width)));
  let poolFailure: ((err: unknown) => void) | null = null;
  // An 'error' event with no listener would throw from the emitter and kill the process.
  const failed = new Promise<never>((_, reject) => { poolFailure = reject; });
  failed.catch(() => {});
  const onError = (err: unknown): void => poolFailure?.(err);
  own.on('error', onError);
  try {
    const results = await Promise.race([Promise.all(tasks.map((t) => own.run(t))), failed]);
    return results.map((r) => {
      if (!r.ok) throw deserializeError(r.error);
      return r;
    });
  } finally {
    own.off('error', onError);
    if (!pool) await own.destroy();
  }
}
