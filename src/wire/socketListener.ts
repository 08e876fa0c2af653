// The Unix socket file of one device (or the node's control socket): takes its lock, clears a socket left by a daemon
// that died, binds with mode 0600, and on close removes exactly what it made. It reads nothing
// from connections: each accepted socket is handed to `onConnection` (admission and serving are
// the rank server's). `close()` undoes everything synchronously, at any point, even while
// `listen()` is still in progress.
import { chmodSync, lstatSync, unlinkSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { ServeError } from '../errors.js';
import type { Logger } from '../log.js';
import { acquireDeviceLock, type DeviceLock } from './deviceLock.js';
import { checkSocketPathLength, removeSocketDirIfCreated, resolveSocketDir, socketPathFor } from './socketDir.js';

export interface SocketListenerOptions {
  /** The device's uuid, or CONTROL_SOCKET_NAME: the socket is <name>.sock and the lock <name>.lock in the socket directory. */
  name: string;
  /** Default: a private per-user directory under the temp dir (socketDir.ts). */
  socketDir?: string;
  /** A lock taken earlier (before loading, to fail fast); taken here when absent. */
  lock?: DeviceLock;
  log: Logger;
}

/** Whether a socket path is served: connect succeeds (live) or is refused (stale file). */
function probeSocket(path: string): Promise<'live' | 'stale' | 'absent'> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    const timer = setTimeout(() => finish('live'), 2000); // a wedged server still owns it
    function finish(result: 'live' | 'stale' | 'absent' | Error) {
      clearTimeout(timer);
      s.destroy();
      if (result instanceof Error) reject(result);
      else resolve(result);
    }
    s.on('connect', () => finish('live'));
    s.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'ECONNREFUSED') finish('stale');
      else if (err.code === 'ENOENT') finish('absent');
      else if (err.code === 'EAGAIN') finish('live'); // backlog full: someone is listening
      else finish(new ServeError('E_SOCKET_PATH', `cannot probe existing socket ${path}: ${err.message}; remove it if no daemon serves it`, { path }, { cause: err }));
    });
  });
}

export class SocketListener {
  readonly #options: SocketListenerOptions;
  readonly #log: Logger;
  readonly #uid = process.getuid!();
  #closed = false;
  #lock: DeviceLock | undefined;
  #server: Server | undefined;
  #socketPath: string | undefined;
  #socketDir: string | undefined;
  /** The inode we bound, so close() never unlinks a socket some other daemon bound later. */
  #socketIno: number | undefined;

  constructor(options: SocketListenerOptions) {
    this.#options = options;
    this.#log = options.log;
    this.#lock = options.lock;
  }

  /** The bound socket's path; undefined until bound. */
  get path(): string | undefined {
    return this.#socketPath;
  }

  /**
   * Checks the directory, takes the device lock, clears a stale socket, binds. On failure the
   * caller closes the listener, which lets go of everything taken so far.
   */
  async listen(onConnection: (socket: Socket) => void): Promise<string> {
    this.#throwIfClosed();
    const uuid = this.#options.name;
    const dir = resolveSocketDir(this.#options.socketDir);
    this.#socketDir = dir;
    const path = socketPathFor(dir, uuid);
    checkSocketPathLength(path);
    this.#lock ??= acquireDeviceLock(dir, uuid, (holder) =>
      this.#log.warn({ socketDir: dir, deadPid: holder.pid, device: uuid }, 'took over the device lock of a weightd that no longer runs'),
    );
    await this.#clearStaleSocket(path);
    this.#throwIfClosed();
    await this.#bind(path, onConnection);
    this.#throwIfClosed();
    return path;
  }

  /**
   * Stops listening and removes the socket and lock (a lock passed in options too). Synchronous;
   * safe at any time and more than once: each resource is let go the first time only. Accepted
   * connections are the caller's to close.
   */
  close(): void {
    this.#closed = true;
    const server = this.#server;
    this.#server = undefined;
    server?.close();
    if (this.#socketPath && this.#socketIno !== undefined) {
      try {
        if (lstatSync(this.#socketPath).ino === this.#socketIno) unlinkSync(this.#socketPath);
      } catch {
        // Already gone.
      }
    }
    this.#socketIno = undefined;
    const lock = this.#lock;
    this.#lock = undefined;
    lock?.unlock();
    if (this.#socketDir) removeSocketDirIfCreated(this.#socketDir);
  }

  /** close() may run while listen() awaits; what listen() acquired after it is let go here. */
  #throwIfClosed(): void {
    if (!this.#closed) return;
    this.close();
    throw new ServeError('E_SERVE_CLOSED', `serving device ${this.#options.name} was stopped while it started`);
  }

  async #clearStaleSocket(path: string): Promise<void> {
    let st;
    try {
      st = lstatSync(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw new ServeError('E_SOCKET_PATH', `cannot inspect ${path}: ${(err as Error).message}`, { path }, { cause: err });
    }
    if (!st.isSocket() || st.uid !== this.#uid) {
      throw new ServeError(
        'E_SOCKET_PATH',
        `${path} exists and is not a socket of this user (${st.isSymbolicLink() ? 'a symbolic link' : st.isSocket() ? `owned by uid ${st.uid}` : 'not a socket'}); weightd will not replace it. Remove it and start again`,
        { path },
      );
    }
    const state = await probeSocket(path);
    if (state === 'live') {
      throw new ServeError(
        'E_SOCKET_IN_USE',
        `${path} accepts connections although its device lock was free: another weightd (maybe in another container or pid namespace sharing this directory) serves device ${this.#options.name}; stop it or use another --weight-cache-socket-dir`,
        { path },
      );
    }
    if (state === 'stale') {
      // We hold the device lock and nothing listens: the file is left over from a daemon that
      // was killed. Only now is it safe to remove.
      unlinkSync(path);
      this.#log.warn({ socket: path }, 'removed a stale socket left by a weightd that no longer runs');
    }
  }

  #bind(path: string, onConnection: (socket: Socket) => void): Promise<void> {
    const server = createServer();
    this.#server = server;
    server.on('connection', onConnection);
    return new Promise((resolve, reject) => {
      // listen() binds synchronously and reports 'listening' or 'error' on the next tick, before
      // any timer or I/O callback (such as a close() from the actor's cleanup) can run.
      server.once('error', (err: NodeJS.ErrnoException) => {
        reject(new ServeError('E_SOCKET_BIND', `cannot bind ${path}: ${err.message}${err.code === 'EADDRINUSE' ? '; another process created it just now' : ''}`, { path }, { cause: err }));
      });
      server.once('listening', () => {
        const st = lstatSync(path);
        this.#socketPath = path;
        this.#socketIno = st.ino;
        if ((st.mode & 0o777) !== 0o600) chmodSync(path, 0o600);
        server.removeAllListeners('error');
        server.on('error', (err) => this.#log.error({ err, socket: path }, 'socket server error'));
        resolve();
      });
      // The socket must never exist with a mode wider than 0600, not even for an instant: bind(2)
      // creates it with 0777 & ~umask, so the umask is narrowed around listen(), which binds
      // synchronously. The umask is process-wide, but nothing else runs on this thread meanwhile,
      // and other threads' files only get narrower modes for that instant. (The socket
      // directory is 0700 as well, so this is a second wall, not the only one.)
      const previous = process.umask(0o177);
      try {
        server.listen(path);
      } finally {
        process.umask(previous);
      }
    });
  }
}
