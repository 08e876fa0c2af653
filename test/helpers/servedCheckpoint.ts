// What the keeper tests ask of a daemon that restarted: that rank 0 of a tp=1 model serves the
// checkpoint's very bytes, and how much the daemon read (adopting reads no tensor data).
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket } from '../../src/client/index.js';
import { runClient } from '../client/runClient.js';
import { expectedRank } from '../serve/checkpointOracle.js';

/** A client of rank 0 of `dir` (at tp 1), attaching with its fingerprint, maps the checkpoint's bytes. */
export async function assertServes(socketDir: string, dir: string): Promise<void> {
  const socket = await findSocket({ socketDir, globalRank: 0 });
  const got = await runClient<{ tensors: Record<string, { sha256: string }> }>('ts', 'hashes', socket, await expectedFingerprint(dir, 1, 0), 'map');
  for (const [name, e] of expectedRank(dir, 1, 0)) assert.is(got.tensors[name]!.sha256, e.sha256, `${dir} ${name}`);
}

/** Bytes the process passed through read(2) and friends so far (/proc/PID/io rchar). */
export function readChars(pid: number): number {
  return Number(/rchar: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))![1]);
}

export function checkpointBytes(dir: string): number {
  return readdirSync(dir).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + readFileSync(join(dir, f)).length, 0);
}
