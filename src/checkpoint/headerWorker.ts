// Piscina task file: parses, validates and hashes one batch of shard headers off the main
// thread. Failures come back as data rather than as a rejection, because a thrown error loses
// its class and `code` when piscina moves it across the thread boundary.

import { serializeError, type SerializedError } from '../errors.js';
import { parseSafetensors, type SafetensorsHeader } from './parseSafetensors.js';

export interface HeaderTask {
  paths: string[];
}

export type HeaderResult = { ok: true; headers: SafetensorsHeader[] } | { ok: false; error: SerializedError };

export default async function parseHeaders({ paths }: HeaderTask): Promise<HeaderResult> {
  try {
    return { ok: true, headers: await Promise.all(paths.map(parseSafetensors)) };
  } catch (err) {
    return { ok: false, error: serializeError(err) };
  }
}
