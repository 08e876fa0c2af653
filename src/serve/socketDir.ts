// The directory that holds the per-device sockets, their lock files and the node manifest. Its
// checks are what stop another user from reading or hijacking the cache: a socket path under a
// directory someone else controls can be swapped for theirs between our bind and a client's
// connect, so the directory must be ours and closed to others.
import { lstatSync, mkdirSync, readlinkSync, type Stats } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ServeError } from '../errors.js';

export const SOCKET_SUFFIX = '.sock';
export const LOCK_SUFFIX = '.lock';
export const NODE_MANIFEST = 'node.json';
/** sun_path holds 108 bytes including the terminating NUL. */
const MAX_SOCKET_PATH = 107;

function currentUid(): number {
  const uid = process.getuid?.();
  if (uid === undefined) throw new ServeError('E_PLATFORM', 'serving needs a POSIX system (process.getuid is missing)');
  return uid;
}

/** `<tmpdir>/weightd-<uid>`: private to this user, stable across restarts so clients find it. */
export function defaultSocketDir(): string {
  return join(tmpdir(), `weightd-${currentUid()}`);
}

/** A device id as a file name: GPU UUIDs and host ids are already safe; anything else is escaped (docs/spec/socket-names.md). */
export function deviceFileStem(uuid: string): string {
  // u: one _ per code point, as the Python client counts them, not per UTF-16 unit.
  const stem = uuid.replace(/[^A-Za-z0-9._-]/gu, '_');
  if (stem === '') return '_';
  return stem.startsWith('.') ? `_${stem.slice(1)}` : stem;
}

export function socketPathFor(dir: string, uuid: string): string {
  return join(dir, deviceFileStem(uuid) + SOCKET_SUFFIX);
}

export function lockPathFor(dir: string, uuid: string): string {
  return join(dir, deviceFileStem(uuid) + LOCK_SUFFIX);
}

function mode(st: Stats): string {
  return `0${(st.mode & 0o777).toString(8).padStart(3, '0')}`;
}

function lstatOrNull(path: string): Stats | null {
  try {
    return lstatSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new ServeError('E_SOCKET_DIR', `cannot inspect socket directory ${path}: ${(err as Error).message}`, { path }, { cause: err });
  }
}

/**
 * Returns the absolute socket directory, created (0700) if absent, after checking that it is a
 * real directory (not a symlink) owned by this user. The default directory must be closed to
 * group and others; a directory the operator chose may be readable by them (its sockets are
 * 0600 anyway) but not writable, since write access lets them replace our socket files.
 */
export function resolveSocketDir(dir?: string): string {
  const isDefault = dir === undefined;
  const path = resolve(dir ?? defaultSocketDir());
  const flag = isDefault ? 'the default socket directory' : 'socket directory (--weight-cache-socket-dir)';
  let st = lstatOrNull(path);
  if (!st) {
    try {
      // mkdir never follows a symlink planted at the last component: it fails with EEXIST.
      mkdirSync(path, { mode: 0o700, recursive: !isDefault });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
        throw new ServeError('E_SOCKET_DIR', `cannot create ${flag} ${path}: ${(err as Error).message}; create it (mode 0700) or pass another directory`, { path }, { cause: err });
      }
    }
    st = lstatOrNull(path);
    if (!st) throw new ServeError('E_SOCKET_DIR', `${flag} ${path} vanished right after it was created; is another process removing it?`, { path });
  }
  if (st.isSymbolicLink()) {
    let target = '?';
    try {
      target = readlinkSync(path);
    } catch {
      // Only for the message.
    }
    throw new ServeError(
      'E_SOCKET_DIR_SYMLINK',
      `${flag} ${path} is a symbolic link (to ${target}); weightd refuses links there because whoever controls the link controls where clients connect. ` +
        `Remove the link (rm ${path}) or pass the real directory with --weight-cache-socket-dir`,
      { path, target },
    );
  }
  if (!st.isDirectory()) {
    throw new ServeError('E_SOCKET_DIR_NOT_DIR', `${flag} ${path} exists but is not a directory; remove it or pass another directory`, { path });
  }
  const uid = currentUid();
  if (st.uid !== uid) {
    throw new ServeError(
      'E_SOCKET_DIR_OWNER',
      `${flag} ${path} is owned by uid ${st.uid}, not by this user (uid ${uid}); another user could read or replace the sockets. ` +
        `Remove it (as its owner) or pass a directory you own with --weight-cache-socket-dir`,
      { path, owner: st.uid, uid },
    );
  }
  const open = isDefault ? st.mode & 0o077 : st.mode & 0o022;
  if (open) {
    throw new ServeError(
      'E_SOCKET_DIR_MODE',
      isDefault
        ? `${flag} ${path} has mode ${mode(st)}: group or others can access it. Run "chmod 700 ${path}"`
        : `${flag} ${path} has mode ${mode(st)}: group or others can write to it and replace the sockets. Run "chmod go-w ${path}"`,
      { path, mode: st.mode & 0o777 },
    );
  }
  return path;
}

/** Refuses a socket path that the kernel would truncate. */
export function checkSocketPathLength(path: string): void {
  const bytes = Buffer.byteLength(path);
  if (bytes > MAX_SOCKET_PATH) {
    throw new ServeError(
      'E_SOCKET_PATH_TOO_LONG',
      `socket path ${path} is ${bytes} bytes; Unix sockets allow at most ${MAX_SOCKET_PATH}. Pass a shorter --weight-cache-socket-dir`,
      { path, bytes },
    );
  }
}
