// The one rule of a checkpoint file's identity (docs/spec/file-identity.md): device, inode, size,
// and modification and change times in nanoseconds, from one stat that follows symlinks (the
// file whose bytes are read). Recorded when a checkpoint is planned, before any of its bytes are
// read, and compared before what was loaded from it is trusted: at adoption from the keeper,
// before a rank serves, and when a client asks for state. Any write moves a file's ctime, which
// no user can set back; a replacement (mv, a new download) brings another inode. Numbers that may
// pass 2^53 (inodes, nanoseconds) are kept as decimal strings, exact and JSON-safe.
import { statSync, type BigIntStats } from 'node:fs';
import { stat } from 'node:fs/promises';
import { basename } from 'node:path';
import { CheckpointError } from '../errors.js';

export interface FileIdentity {
  path: string;
  dev: string;
  ino: string;
  size: number;
  mtimeNs: string;
  ctimeNs: string;
}

/** How a file differs from its recorded identity: the first field that does, most telling first. */
export interface IdentityChange {
  path: string;
  /** `gone`: it cannot be stat'ed now (`now` is the errno code). */
  field: 'gone' | 'dev' | 'ino' | 'size' | 'mtime' | 'ctime';
  was: string;
  now: string;
}

function fromStats(path: string, st: BigIntStats): FileIdentity {
  return { path, dev: String(st.dev), ino: String(st.ino), size: Number(st.size), mtimeNs: String(st.mtimeNs), ctimeNs: String(st.ctimeNs) };
}

/** Each file's identity now, in order (a path listed twice once). Throws what stat throws. */
export function fileIdentities(paths: readonly string[]): FileIdentity[] {
  return [...new Set(paths)].map((path) => fromStats(path, statSync(path, { bigint: true })));
}

/** Compared in this order, so a replaced file says so rather than that its times moved. */
const FIELDS = [
  ['dev', 'dev'],
  ['ino', 'ino'],
  ['size', 'size'],
  ['mtime', 'mtimeNs'],
  ['ctime', 'ctimeNs'],
] as const;

/**
 * How `now` differs from `recorded`, or undefined when it is the same file, unchanged. The path
 * is not compared: a checkpoint directory moved within its file system keeps its files' identity.
 */
export function identityChange(recorded: FileIdentity, now: FileIdentity | { gone: string }): IdentityChange | undefined {
  if ('gone' in now) return { path: recorded.path, field: 'gone', was: recorded.ino, now: now.gone };
  for (const [field, key] of FIELDS) {
    if (String(recorded[key]) !== String(now[key])) return { path: recorded.path, field, was: String(recorded[key]), now: String(now[key]) };
  }
  return undefined;
}

const HOW: Record<IdentityChange['field'], [label: string, meaning: string]> = {
  gone: ['', 'gone'],
  dev: ['device', 'replaced'],
  ino: ['inode', 'replaced'],
  size: ['size', 'resized'],
  mtime: ['mtime', 'modified'],
  ctime: ['ctime', 'written'],
};

/** "model.safetensors: inode 123 -> 456 (replaced)", "...: ctime A -> B (written)", "...: gone (ENOENT)". */
export function describeChange(c: IdentityChange): string {
  const [label, meaning] = HOW[c.field];
  return c.field === 'gone' ? `${basename(c.path)}: gone (${c.now})` : `${basename(c.path)}: ${label} ${c.was} -> ${c.now} (${meaning})`;
}

/** The identity of `path` now, or how it cannot be read. */
async function identityNow(path: string): Promise<FileIdentity | { gone: string }> {
  try {
    return fromStats(path, await stat(path, { bigint: true }));
  } catch (err) {
    return { gone: (err as NodeJS.ErrnoException).code ?? (err as Error).message };
  }
}

/** Every file that differs from its recorded identity now (empty: all unchanged): one stat each, off the event loop. */
export async function changedFiles(recorded: readonly FileIdentity[]): Promise<IdentityChange[]> {
  const now = await Promise.all(recorded.map((f) => identityNow(f.path)));
  return recorded.flatMap((f, i) => identityChange(f, now[i]!) ?? []);
}

/** The same, between two records of the same files in the same order (a kept record's and this start's plan's). */
export function changesBetween(recorded: readonly FileIdentity[], now: readonly FileIdentity[]): IdentityChange[] {
  return recorded.flatMap((f, i) => identityChange(f, now[i] ?? { gone: 'not in this plan' }) ?? []);
}

/** Throws E_FILE_CHANGED naming each file that differs from its recorded identity, and how: "checkpoint files changed `when` (...); `then`". */
export async function checkFileIdentities(files: readonly FileIdentity[], when: string, then: string): Promise<void> {
  const changes = await changedFiles(files);
  if (changes.length === 0) return;
  throw new CheckpointError('E_FILE_CHANGED', `checkpoint files changed ${when} (${changes.map(describeChange).join('; ')}); ${then}`, { path: changes[0]!.path, changes });
}
