// Piscina task file: parses, validates and hashes one batch of shard headers, or samples one
// batch of shards' tensor bytes (the `content` fingerprint field), off the main thread.
// Failures come back as data rather than as a rejection, because a thrown error loses its class
// and `code` when piscina moves it across the thread boundary.

import { serializeError, type SerializedError } from '../errors.js';
import { parseSafetensors, type SafetensorsHeader } from './parseSafetensors.js';
import { fileContentDigest } from './sampleContent.js';

/** One file to sample: its tensors as flat [begin, end) pairs; the checkpoint's data bytes, and those of the files before it. */
export interface ContentJob {
  path: string;
  spans: number[];
  totalDataBytes: number;
  dataBefore: number;
}

export type HeaderTask = { paths: string[] } | { content: ContentJob[] };

export type HeaderResult =
  | { ok: true; headers: SafetensorsHeader[] }
  | { ok: true; digests: string[] }
  | { ok: false; error: SerializedError };

export default async function runCheckpointTask(task: HeaderTask): Promise<HeaderResult> {
  try {
    if ('content' in task) return { ok: true, digests: task.content.map((j) => fileContentDigest(j.path, j.spans, j.totalDataBytes, j.dataBefore)) };
    return { ok: true, headers: await Promise.all(task.paths.map(parseSafetensors)) };
  } catch (err) {
    return { ok: false, error: serializeError(err) };
  }
}
