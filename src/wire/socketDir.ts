// The directory that holds the per-device sockets, their lock files and the node manifest. Its
// checks are what stop another user from reading or hijacking the cache: a socket path under a
// directory someone else controls can be swapped for theirs between our bind and a client's
// connect, so the directory must be ours and closed to others.
import { lstatSync, mkdirSync, readlinkSync, realpathSync, rmdirSync, type Stats } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { ServeError } from '../errors.js';

export const SOCKET_SUFFIX = '.sock';
export const LOCK_SUFFIX = '.lock';
export const NODE_MANIFEST = 'node.json';
/** The node's keeper listens here unless --keeper-socket says otherwise (keeper/keeperSocketPath.ts). */
export const KEEPER_SOCKET_NAME = 'keeper.sock';
/** A daemon's control socket and its lock in the socket directory: control-<pid>.sock, control-<pid>.lock. */
export const CONTROL_FILE = /^control-(\d+)\.(sock|lock)$/;
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
 * Socket directories this process created, each with the highest directory its mkdir made (the
 * directory itself, or an ancestor when missing parents were made too): it removes them again
 * when it stops using them.
 */
const created = new Map<string, string>();

/**
 * Removes `dir` if this process created it and nothing is left in it, with the parents its mkdir
 * made. Called after each thing this process kept there (socket, lock, node manifest) is
 * removed, so whichever goes last takes the directory with it; a directory the operator made is
 * never removed.
 */
export function removeSocketDirIfCreated(dir: string): void {
  const path = resolve(dir);
  const first = created.get(path);
  if (first === undefined) return;
  for (let d = path; ; d = dirname(d)) {
    try {
      rmdirSync(d);
    } catch {
      // Not empty yet (another rank still serves from it, or someone else's file is in a parent
      // we made), or already gone.
      return;
    }
    if (d === path) created.delete(path);
    if (d === first || d === dirname(d)) return;
  }
}

/** A directory anyone may create entries in, such as /tmp: sticky and world-writable. */
function isSharedTempDir(st: Stats): boolean {
  return (st.mode & 0o1002) === 0o1002;
}

/**
 * Whoever can rename or replace any directory above the socket directory can swap the whole
 * tree, so every ancestor must be owned by root or by us, and not writable by group or others
 * unless it has the sticky bit (then others cannot rename what is not theirs). The same rule as
 * OpenSSH's StrictModes (secure_path): checked along the path as given and along its real path,
 * since a symbolic link in the way is as good as the directory it names. Before the directory is
 * made, its real path is that of its deepest existing ancestor, and what is missing below that
 * is for us to make: so a refusal comes before anything is made inside another user's directory.
 */
function checkAncestors(path: string, flag: string, uid: number): void {
  const chain = (p: string): string[] => {
    const out: string[] = [];
    for (let d = dirname(p); ; d = dirname(d)) {
      out.push(d);
      if (d === dirname(d)) return out;
    }
  };
  const lexical = chain(path);
  const deepest = [path, ...lexical].find((p) => lstatOrNull(p) !== null) ?? '/';
  let real: string[] = [];
  try {
    const realDeepest = realpathSync(deepest);
    real = deepest === path ? chain(realDeepest) : [realDeepest, ...chain(realDeepest)];
  } catch {
    // The lexical chain below reports whatever makes the real path unreadable.
  }
  for (const ancestor of new Set([...lexical, ...real])) {
    const st = lstatOrNull(ancestor);
    if (!st) {
      if (deepest !== path) continue; // below the deepest existing one: ours to make
      throw new ServeError('E_SOCKET_DIR', `${flag} ${path}: its ancestor ${ancestor} does not exist`, { path, ancestor });
    }
    if (st.uid !== 0 && st.uid !== uid) {
      throw new ServeError(
        'E_SOCKET_DIR_ANCESTOR',
        `${flag} ${path} is inside ${ancestor}, which is owned by uid ${st.uid} (neither root nor this user, uid ${uid}); that user could replace the directory and the sockets in it. ` +
          `Pass a directory under one owned by root or by you with --weight-cache-socket-dir`,
        { path, ancestor, owner: st.uid, uid },
      );
    }
    if (!st.isSymbolicLink() && st.mode & 0o022 && !(st.mode & 0o1000)) {
      throw new ServeError(
        'E_SOCKET_DIR_ANCESTOR',
        `${flag} ${path} is inside ${ancestor}, which has mode ${mode(st)}: group or others can write to it without the sticky bit, so they could replace the directory. ` +
          `Pass a directory under one that only root or you can write to with --weight-cache-socket-dir`,
        { path, ancestor, mode: st.mode & 0o7777 },
      );
    }
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
  const uid = currentUid();
  let st = lstatOrNull(path);
  if (!st) {
    // A refused start leaves nothing: the ancestors are checked before anything is made, and
    // what was made is removed again if a check after it refuses the directory.
    checkAncestors(path, flag, uid);
    try {
      // mkdir never follows a symlink planted at the last component: it fails with EEXIST.
      created.set(path, mkdirSync(path, { mode: 0o700, recursive: !isDefault }) ?? path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
        throw new ServeError('E_SOCKET_DIR', `cannot create ${flag} ${path}: ${(err as Error).message}; create it (mode 0700) or pass another directory`, { path }, { cause: err });
      }
    }
    st = lstatOrNull(path);
    if (!st) throw new ServeError('E_SOCKET_DIR', `${flag} ${path} vanished right after it was created; is another process removing it?`, { path });
  }
  try {
    return checkSocketDir(path, st, isDefault, flag, uid);
  } catch (err) {
    removeSocketDirIfCreated(path);
    throw err;
  }
}

/** The checks of resolveSocketDir once `path` exists (`st`, its lstat); returns `path`. */
function checkSocketDir(path: string, st: Stats, isDefault: boolean, flag: string, uid: number): string {
  // Again now that the directory exists: a link swapped in meanwhile shows in its real path.
  checkAncestors(path, flag, uid);
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
        : isSharedTempDir(st)
          ? // A shared or system directory (such as /tmp) must stay as it is: never advise narrowing it.
            `${flag} ${path} has mode ${mode(st)}: group or others can write to it and replace the sockets. Pass a private directory inside it instead, such as ${join(path, `weightd-${uid}`)} (weightd creates it, mode 0700)`
          : `${flag} ${path} has mode ${mode(st)}: group or others can write to it and replace the sockets. Run "chmod go-w ${path}"`,
      { path, mode: st.mode & 0o777 },
    );
  }
  return path;
}

/**
 * resolveSocketDir once more for a directory it returned that has since vanished (another daemon
 * of this user created it, and removed it on stopping): made again and checked as the first
 * time, the default directory as the default.
 */
export function resolveSocketDirAgain(path: string): string {
  return resolveSocketDir(path === resolve(defaultSocketDir()) ? undefined : path);
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
