// `node.json` in the socket directory: which socket serves which rank, on which device, with
// which fingerprint. Clients read it to find their socket without probing every one. It is
// written once the node is ready, by rename over a temp file, so a reader sees the old file or
// the new one, never half of one.
import { closeSync, openSync, renameSync, unlinkSync, writeSync, constants } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { ServeError } from '../errors.js';
import { readSmallFileSync } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';
import type { RankTableEntry } from './rankTable.js';
import { ownProcessIdentity } from './processLiveness.js';
import { NODE_MANIFEST, removeSocketDirIfCreated } from './socketDir.js';

export const NODE_MANIFEST_VERSION = 1;

/** node.json of 4096 ranks is ~1.5 MiB. */
const MAX_NODE_MANIFEST_BYTES = 16 << 20;

export interface NodeManifestEntry {
  globalRank: number;
  localRank: number;
  socketPath: string;
  deviceUuid: string;
  fingerprint: string;
}

/** One model version the node serves, with its ranks' sockets (docs/operations.md, Several models). */
export interface NodeManifestModel {
  name: string;
  /** The checkpoint fingerprint; each rank's own is in its entry. */
  fingerprint: string;
  tpSize: number;
  /** Unloaded or superseded: it takes no new lease and goes once its leases end. */
  draining: boolean;
  ranks: NodeManifestEntry[];
}

/** The node's place in its tensor-parallel group, so an engine can check its own rank mapping. */
export interface NodeGroupInfo {
  nodeRank: number;
  nnodes: number;
  tpSize: number;
  /** Every rank of the group, on every node: global rank, node, local rank, host, device. */
  rankTable: RankTableEntry[];
}

export interface NodeManifest {
  version: number;
  /** The daemon that wrote it; a reader ignores the file when that process is gone. */
  pid: number;
  /**
   * The daemon's start time (docs/spec/liveness.md), where /proc has it: a reused pid then does
   * not pass a dead daemon's file for a live one.
   */
  startTime?: string;
  writtenAt: string;
  /** The node's own model's ranks. */
  ranks: NodeManifestEntry[];
  group?: NodeGroupInfo;
  /** Every model version that serves, the node's own first (absent from daemons of one model). */
  models?: NodeManifestModel[];
}

export function nodeManifestPath(socketDir: string): string {
  return join(socketDir, NODE_MANIFEST);
}

export function writeNodeManifest(socketDir: string, entries: NodeManifestEntry[], group?: NodeGroupInfo, models?: NodeManifestModel[]): string {
  const path = nodeManifestPath(socketDir);
  const manifest: NodeManifest = {
    version: NODE_MANIFEST_VERSION,
    ...ownProcessIdentity(),
    writtenAt: new Date().toISOString(),
    ranks: [...entries].sort((a, b) => a.globalRank - b.globalRank),
    group,
    models,
  };
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  try {
    const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      writeSync(fd, `${JSON.stringify(manifest, null, 2)}\n`);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // Never created, or already renamed.
    }
    throw new ServeError('E_NODE_MANIFEST', `cannot write the node manifest ${path}: ${(err as Error).message}`, { path }, { cause: err });
  }
  return path;
}

/** Reads the manifest; null when there is none. Throws ServeError when it is not one. */
export function readNodeManifest(socketDir: string): NodeManifest | null {
  const path = nodeManifestPath(socketDir);
  let text: string;
  try {
    text = readSmallFileSync(path, MAX_NODE_MANIFEST_BYTES);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new ServeError('E_NODE_MANIFEST', `cannot read the node manifest ${path}: ${(err as Error).message}`, { path }, { cause: err });
  }
  try {
    const m = parseBoundedJson(text) as NodeManifest;
    if (m.version === NODE_MANIFEST_VERSION && Number.isInteger(m.pid) && (m.startTime === undefined || typeof m.startTime === 'string') && Array.isArray(m.ranks)) return m;
  } catch {
    // Falls through.
  }
  throw new ServeError('E_NODE_MANIFEST', `${path} is not a weightd node manifest (version ${NODE_MANIFEST_VERSION}); remove it`, { path });
}

/** Removes the manifest if this process wrote it (another daemon may share the directory). */
export function removeNodeManifest(socketDir: string): void {
  try {
    if (readNodeManifest(socketDir)?.pid === process.pid) unlinkSync(nodeManifestPath(socketDir));
  } catch {
    // Already gone or not ours: nothing to remove.
  }
  removeSocketDirIfCreated(socketDir);
}
