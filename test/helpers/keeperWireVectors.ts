// test/vectors/keeper-wire.json (docs/spec/keeper-wire.md), typed, for the tests of both sides:
// the TypeScript codec (test/keeper/keeperProtocol.test.ts) and the keeper binary
// (test/keeper/keeperWire.test.ts, test/keeper/badInput.test.ts).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from './paths.js';

type Op = 'KEEP' | 'TAKE' | 'DROP' | 'LIST' | 'PING' | 'WATCH';

export interface KeeperWireVectors {
  constants: { magic: string; protocolVersion: number; headerBytes: number; maxRequestBytes: number; maxOtherRequestBytes: number; maxReplyBytes: number; maxRecordFds: number; fdsPerBatch: number; maxFdsPerMessage: number };
  ops: Record<Op, number>;
  requests: Array<{ why: string; op: Op; device?: string; fingerprint?: string; record?: string; frame: string }>;
  replies: Array<{ why: string; op: Op; frame: string; decoded?: unknown; error?: { code: string; message: string } }>;
  badReplies: Array<{ why: string; op: Op; frame: string }>;
  refused: Array<{ why: string; frame: string; code: string; says: string }>;
  exchanges: Array<{ why: string; request: string; fds: number; reply?: string; code?: string }>;
}

export const keeperWire = JSON.parse(readFileSync(join(repoRoot, 'test/vectors/keeper-wire.json'), 'utf8')) as KeeperWireVectors;

/** A vector's hex, its spaces (there for reading) dropped. */
export const fromHex = (hex: string): Buffer => Buffer.from(hex.replace(/ /g, ''), 'hex');
