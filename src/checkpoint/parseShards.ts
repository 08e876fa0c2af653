// Parses every shard header of a checkpoint, in a piscina pool when there are enough shards for
// it to pay. A 100k-tensor header is tens of MB of JSON: parsing, duplicate scanning and hashing
// it on the main thread would stall the daemon's sockets and state machine for that long.

import { availableParallelism } from 'node:os';
import { Piscina } from 'piscina';
import { deserializeError } from '../errors.js';
import type { HeaderResult, HeaderTask } from './headerWorker.js';
import { parseSafetensors, type SafetensorsHeader } from './parseSafetensors.js';

/**
 * Up to this many shards are parsed on the calling thread. Starting workers costs ~30-50 ms,
 * more than parsing a few ordinary headers (a 4-shard 8B model has ~300 tensors, well under
 * 1 ms of JSON), so a pool only pays for checkpoints with many or very large headers.
 */
export const INLINE_PARSE_MAX_FILES = 4;

export function createHeaderPool(maxThreads = Math.max(1, Math.min(availableParallelism(), 8))): Piscina<HeaderTask, HeaderResult> {
  return new Piscina<HeaderTask, HeaderResult>({
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
  const own = pool ?? createHeaderPool(Math.max(1, Math.min(availableParallelism(), 8, paths.length)));
  let poolFailure: ((err: unknown) => void) | null = null;
  // An 'error' event with no listener would throw from the emitter and kill the process.
  const failed = new Promise<never>((_, reject) => { poolFailure = reject; });
  failed.catch(() => {});
  const onError = (err: unknown): void => poolFailure?.(err);
  own.on('error', onError);
  try {
    const results = await Promise.race([Promise.all(paths.map((p) => own.run({ paths: [p] }))), failed]);
    return results.flatMap((r) => {
      if (!r.ok) throw deserializeError(r.error);
      return r.headers;
    });
  } finally {
    own.off('error', onError);
    if (!pool) await own.destroy();
  }
}
