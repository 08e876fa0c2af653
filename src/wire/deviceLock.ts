// One daemon per device: `<uuid>.lock` in the socket directory names the daemon that serves that
// device. The file is published with link(2), which fails if the name exists, so it appears
// atomically with its full content (an O_EXCL create would leave a moment where it is empty).
// A lock whose process is gone (a daemon killed with SIGKILL) is stale and taken over.
//
// Why not flock(2): Node has no flock, and the lock must also be readable by the *second*
// daemon to name the holder in its error, which a plain pid file gives. The one hazard of pid
// files, two starters taking over the same stale lock at once, is handled by renaming the stale
// file away first: rename is atomic, so only one of them gets it, and the loser re-checks.
import { closeSync, linkSync, openSync, renameSync, unlinkSync, writeSync, constants } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { dirname } from 'node:path';
import { ServeError } from '../errors.js';
import { readSmallFileSync } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';
import { isProcessAlive, processIdentity, type ProcessIdentity } from './processLiveness.js';
import { lockPathFor, removeSocketDirIfCreated, resolveSocketDirAgain } from './socketDir.js';

/** A lock holds a pid, a start time and a device UUID: well under this. */
const MAX_LOCK_BYTES = 64 << 10;

export interface DeviceLock {
  readonly path: string;
  readonly uuid: string;
  /** Removes the lock file if it still names this process. Synchronous, idempotent. */
  unlock(): void;
}

export interface LockHolder extends ProcessIdentity {
  uuid?: string;
}

function readHolder(path: string): LockHolder | null {
  let text: string;
  try {
    text = readSmallFileSync(path, MAX_LOCK_BYTES);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new ServeError('E_LOCK', `cannot read device lock ${path}: ${(err as Error).message}`, { path }, { cause: err });
  }
  let problem: string;
  try {
    const h = parseBoundedJson(text) as LockHolder | null;
    if (Number.isInteger(h?.pid) && h!.pid > 0) return h!;
    problem = 'JSON without a positive integer "pid"';
  } catch (err) {
    problem = `not JSON: ${(err as Error).message}`;
  }
  // What is wrong, never what the file holds: anyone who can write the directory chose it.
  throw new ServeError(
    'E_LOCK_CORRUPT',
    `device lock ${path} does not hold a weightd pid (${text.length} characters, ${problem}); if no weightd daemon serves this device, remove the file`,
    { path },
  );
}

/** Publishes our lock with link(2): 'taken' when the name is, 'no-dir' when the directory is gone. */
function tryPublish(path: string, content: string): 'published' | 'taken' | 'no-dir' {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  let fd: number;
  try {
    fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'no-dir';
    throw new ServeError('E_LOCK', `cannot create device lock ${path}: ${(err as Error).message}`, { path }, { cause: err });
  }
  try {
    writeSync(fd, content);
  } finally {
    closeSync(fd);
  }
  try {
    linkSync(tmp, path);
    return 'published';
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return 'taken';
    throw new ServeError('E_LOCK', `cannot create device lock ${path}: ${(err as Error).message}`, { path }, { cause: err });
  } finally {
    unlinkSync(tmp);
  }
}

function lockedError(path: string, uuid: string, holder: LockHolder): ServeError {
  return new ServeError(
    'E_DEVICE_LOCKED',
    `device ${uuid} is already served by weightd pid ${holder.pid} (lock ${path}); ` +
      `stop that daemon first (kill ${holder.pid}) or give this one another device or --weight-cache-socket-dir`,
    { path, uuid, holderPid: holder.pid },
  );
}

/**
 * Takes the device's lock or throws E_DEVICE_LOCKED naming the live holder. `onStale` hears of
 * each dead holder whose lock was taken over.
 */
export function acquireDeviceLock(dir: string, uuid: string, onStale?: (holder: LockHolder) => void): DeviceLock {
  const path = lockPathFor(dir, uuid);
  const me = processIdentity(process.pid);
  const content = `${JSON.stringify({ ...me, uuid })}\n`;
  // Each pass either publishes, fails on a live holder, removes one stale lock, or recreates the
  // directory; a handful of passes only happen when several daemons start or stop at once.
  for (let attempt = 0; attempt < 5; attempt++) {
    const published = tryPublish(path, content);
    if (published === 'published') return heldLock(path, uuid, me);
    if (published === 'no-dir') {
      // Another daemon of this user created the directory and, stopping, removed it after we
      // had resolved it: make it again (with the same checks). Once our lock is in it, it stays.
      resolveSocketDirAgain(dir);
      continue;
    }
    const holder = readHolder(path);
    if (!holder) continue; // removed between our link and our read: try again
    if (holder.pid === me.pid && holder.startTime === me.startTime) {
      throw new ServeError('E_DEVICE_LOCKED', `device ${uuid} is already served by this process (lock ${path}); serve each device once`, { path, uuid, holderPid: me.pid });
    }
    if (isProcessAlive(holder)) throw lockedError(path, uuid, holder);
    const grabbed = `${path}.stale.${process.pid}.${randomBytes(4).toString('hex')}`;
    try {
      renameSync(path, grabbed);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue; // another starter took it over first
      throw new ServeError('E_LOCK', `cannot take over stale device lock ${path}: ${(err as Error).message}`, { path }, { cause: err });
    }
    const taken = readHolder(grabbed);
    if (taken && taken.pid === holder.pid && taken.startTime === holder.startTime) {
      unlinkSync(grabbed);
      onStale?.(holder);
      continue;
    }
    // We raced another starter that had just replaced the stale lock with its live one: put
    // theirs back (link fails rather than overwrite if a third one got in) and report them.
    try {
      linkSync(grabbed, path);
    } catch {
      // A third starter got the name meanwhile. Whichever of it and the displaced one binds the
      // socket second finds it live (socketListener never unlinks a socket that accepts) and fails.
    } finally {
      unlinkSync(grabbed);
    }
    throw lockedError(path, uuid, taken ?? holder);
  }
  throw new ServeError('E_LOCK', `device lock ${path} kept changing hands; is another weightd starting on device ${uuid}? Retry`, { path, uuid });
}

function heldLock(path: string, uuid: string, me: ProcessIdentity): DeviceLock {
  let held = true;
  return {
    path,
    uuid,
    unlock() {
      if (!held) return;
      held = false;
      try {
        const holder = readHolder(path);
        // Never remove a lock that is no longer ours (taken over after we were presumed dead).
        if (holder && holder.pid === me.pid && holder.startTime === me.startTime) unlinkSync(path);
      } catch {
        // Gone or unreadable: nothing of ours to remove.
      }
      removeSocketDirIfCreated(dirname(path));
    },
  };
}
