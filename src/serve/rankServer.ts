// The Unix socket server of one resident rank: one socket per local device, serving the manifest
// and segment handles to clients of the same user, with a lease per client (leaseTable.ts).
// `listen()` takes the device lock and binds; `close()` undoes everything synchronously, at any
// point, even while `listen()` is still in progress.
import { chmodSync, lstatSync, unlinkSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { LAYOUT_NAMES } from '../checkpoint/types.js';
import { ServeError, WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import { addon } from '../native/addon.js';
import { ClientConnection, type ConnectionHandler } from './clientConnection.js';
import { acquireDeviceLock, type DeviceLock } from './deviceLock.js';
import { leaseHash, leaseInfo, LeaseTable, type Caller, type Lease } from './leaseTable.js';
import { LogLimiter } from './logLimiter.js';
import {
  PROTOCOL_VERSION,
  type DetachReply,
  type GetStateRequest,
  type MismatchReply,
  type PingReply,
  type ReleaseReply,
  type Request,
  type ServeStatus,
  type StatsReply,
} from './protocol.js';
import { differingFingerprintFields } from './differingFingerprintFields.js';
import type { ServedRank } from './servedRank.js';
import { DEFAULT_SERVE_LIMITS, serveLimits, type ServeLimits } from './serveLimits.js';
import { checkSocketPathLength, removeSocketDirIfCreated, resolveSocketDir, socketPathFor } from './socketDir.js';

export interface RankServerOptions {
  rank: ServedRank;
  /** Default: a private per-user directory under the temp dir (socketDir.ts). */
  socketDir?: string;
  log: Logger;
  /** Frees the rank's memory; resolves once it is freed. Called at most once. */
  release: () => Promise<void>;
  /** A lock taken earlier (before loading, to fail fast); taken here when absent. */
  lock?: DeviceLock;
  limits?: Partial<ServeLimits>;
}

export interface RankServerStats {
  status: ServeStatus;
  connections: number;
  leases: number;
  requests: number;
  protocolErrors: number;
  refusedPeers: number;
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

export class RankServer implements ConnectionHandler {
  readonly rank: ServedRank;
  readonly #log: Logger;
  readonly #options: RankServerOptions;
  #limits: ServeLimits = DEFAULT_SERVE_LIMITS;
  readonly #uid = process.getuid!();
  readonly #leases = new LeaseTable();
  readonly #connections = new Map<number, ClientConnection>();
  readonly #logDropped = (dropped: number) =>
    this.#log.warn({ dropped, socket: this.#socketPath }, `${dropped} more client protocol errors and refused connections were not logged`);
  /** One budget for every line a peer can cause, so no mix of misdeeds floods the log. */
  #peerLog = new LogLimiter(20, DEFAULT_SERVE_LIMITS.logWindowMs, this.#logDropped);
  /** The manifest part of every get_state reply, per layout, serialized once (100k tensors: tens of MB). */
  readonly #manifestJson: Map<string, string>;
  readonly #startedAt = Date.now();
  #nextConnectionId = 1;
  #status: ServeStatus = 'serving';
  #releasing: Promise<void> | undefined;
  #requests = 0;
  #protocolErrors = 0;
  #refusedPeers = 0;
  #closed = false;
  #lock: DeviceLock | undefined;
  #server: Server | undefined;
  #socketPath: string | undefined;
  #socketDir: string | undefined;
  /** The inode we bound, so close() never unlinks a socket some other daemon bound later. */
  #socketIno: number | undefined;
  #sweep: NodeJS.Timeout | undefined;

  constructor(options: RankServerOptions) {
    this.#options = options;
    this.rank = options.rank;
    this.#log = options.log;
    this.#lock = options.lock;
    const r = options.rank;
    this.#manifestJson = new Map(Object.entries(r.layouts).map(([layout, views]) => [layout, JSON.stringify({
      fingerprint: r.fingerprint,
      backend: r.backend,
      device: this.#deviceRef(),
      rank: this.#rankRef(),
      layout,
      tensors: views.tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, segment: t.segment, offset: t.offset, bytes: t.bytes })),
      aliases: views.aliases,
      segments: r.segments.map((s) => ({ segment: s.segment, bytes: s.bytes, handle: s.handle })),
    })]));
  }

  get status(): ServeStatus {
    return this.#status;
  }

  stats(): RankServerStats {
    return {
      status: this.#status,
      connections: this.#connections.size,
      leases: this.#leases.size,
      requests: this.#requests,
      protocolErrors: this.#protocolErrors,
      refusedPeers: this.#refusedPeers,
    };
  }

  /**
   * Checks the directory, takes the device lock, clears a stale socket, binds. On failure
   * everything taken so far is let go (the server is closed) before the error is thrown.
   */
  async listen(): Promise<string> {
    try {
      return await this.#listen();
    } catch (err) {
      this.close();
      throw err;
    }
  }

  async #listen(): Promise<string> {
    this.#throwIfClosed();
    // Read here, not in the constructor: a bad environment value fails listen(), as a start-up error.
    this.#limits = serveLimits(this.#options.limits);
    this.#peerLog = new LogLimiter(20, this.#limits.logWindowMs, this.#logDropped);
    const { uuid } = this.rank.device;
    const dir = resolveSocketDir(this.#options.socketDir);
    this.#socketDir = dir;
    const path = socketPathFor(dir, uuid);
    checkSocketPathLength(path);
    this.#lock ??= acquireDeviceLock(dir, uuid, (holder) =>
      this.#log.warn({ socketDir: dir, deadPid: holder.pid, device: uuid }, 'took over the device lock of a weightd that no longer runs'),
    );
    await this.#clearStaleSocket(path);
    this.#throwIfClosed();
    await this.#bind(path);
    this.#throwIfClosed();
    this.#sweep = setInterval(() => this.#expireDeadLeases(), this.#limits.leaseSweepMs);
    this.#sweep.unref();
    this.#log.info({ socket: path, device: uuid, globalRank: this.rank.globalRank, tensors: this.rank.tensors.length }, 'serving');
    return path;
  }

  /**
   * Stops serving and removes the socket and lock (a lock passed in options too). Synchronous;
   * safe at any time and more than once: each resource is let go the first time only.
   */
  close(): void {
    this.#closed = true;
    clearInterval(this.#sweep);
    // The count of the last burst is logged now rather than lost.
    this.#peerLog.flush();
    for (const c of this.#connections.values()) c.destroy();
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
    lock?.release();
    if (this.#socketDir) removeSocketDirIfCreated(this.#socketDir);
  }

  /** close() may run while listen() awaits; what listen() acquired after it is let go here. */
  #throwIfClosed(): void {
    if (!this.#closed) return;
    this.close();
    throw new ServeError('E_SERVE_CLOSED', `serving device ${this.rank.device.uuid} was stopped while it started`);
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
        `${path} accepts connections although its device lock was free: another weightd (maybe in another container or pid namespace sharing this directory) serves device ${this.rank.device.uuid}; stop it or use another --weight-cache-socket-dir`,
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

  #bind(path: string): Promise<void> {
    const server = createServer();
    this.#server = server;
    server.on('connection', (s) => this.#onConnection(s));
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

  #onConnection(socket: Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    if (this.#connections.size >= this.#limits.maxConnections) {
      this.#peerLog.allow(() => this.#log.warn({ limit: this.#limits.maxConnections }, 'too many client connections: refused one'));
      socket.destroy();
      return;
    }
    const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
    let peer;
    try {
      if (fd === undefined || fd < 0) throw new Error('the socket has no file descriptor');
      peer = addon.peerCredentials(fd);
    } catch (err) {
      this.#peerLog.allow(() => this.#log.warn({ err: (err as Error).message }, 'cannot read the peer credentials of a client: refused it'));
      socket.destroy();
      return;
    }
    if (peer.uid !== this.#uid) {
      // Unreachable with a 0600 socket in a 0700 directory, unless someone widened them, or
      // the peer is root; refusing root as well keeps "only this user" exact.
      this.#refusedPeers++;
      this.#peerLog.allow(() => this.#log.warn({ peerUid: peer.uid, peerPid: peer.pid, uid: this.#uid, socket: this.#socketPath }, 'refused a client of another user'));
      socket.destroy();
      return;
    }
    const caller: Caller = { pid: peer.pid, connectionId: this.#nextConnectionId++ };
    this.#connections.set(caller.connectionId, new ClientConnection(socket, caller, this, this.#limits));
    this.#log.debug({ peerPid: peer.pid, connection: caller.connectionId }, 'client connected');
  }

  // ConnectionHandler

  keepOpen(caller: Caller): boolean {
    return this.#leases.holdsBound(caller.connectionId);
  }

  closed(caller: Caller): void {
    this.#connections.delete(caller.connectionId);
    for (const l of this.#leases.connectionClosed(caller.connectionId)) this.#logLease(l, 'lease ended with its connection');
    this.#log.debug({ peerPid: caller.pid, connection: caller.connectionId }, 'client disconnected');
  }

  violation(caller: Caller, err: WeightdError): void {
    this.#protocolErrors++;
    this.#peerLog.allow(() => this.#log.warn({ peerPid: caller.pid, connection: caller.connectionId, code: err.code }, `closed a client connection: ${err.message}`));
  }

  async handle(req: Request, caller: Caller): Promise<string> {
    this.#requests++;
    switch (req.cmd) {
      case 'ping':
        return JSON.stringify(this.#ping(req.id));
      case 'get_state':
        return this.#getState(req, caller);
      case 'release':
        return JSON.stringify(await this.#release(req.id, caller, req.force ?? false));
      case 'detach': {
        const dropped = this.#leases.detach(caller, req.leaseId);
        for (const l of dropped) this.#logLease(l, 'lease detached');
        const reply: DetachReply = { id: req.id, ok: true, dropped: dropped.length };
        return JSON.stringify(reply);
      }
      case 'stats': {
        this.#expireDeadLeases();
        const s = this.stats();
        const reply: StatsReply = {
          id: req.id,
          ok: true,
          status: s.status,
          connections: s.connections,
          leases: this.#leases.list(),
          requests: s.requests,
          protocolErrors: s.protocolErrors,
          refusedPeers: s.refusedPeers,
          uptimeSeconds: (Date.now() - this.#startedAt) / 1000,
          // What an engine subtracts from its own memory budget on this device (vLLM's KV cache).
          deviceBytes: this.#status === 'released' ? 0 : this.rank.segments.reduce((n, s) => n + s.bytes, 0),
        };
        return JSON.stringify(reply);
      }
    }
  }

  #deviceRef() {
    const d = this.rank.device;
    return { uuid: d.uuid, backend: d.backend, index: d.index, name: d.name };
  }

  #rankRef() {
    const r = this.rank;
    return { globalRank: r.globalRank, localRank: r.localRank, nodeRank: r.nodeRank, nnodes: r.nnodes, tpSize: r.tpSize };
  }

  #ping(id: number): PingReply {
    const r = this.rank;
    return {
      id,
      ok: true,
      status: this.#status,
      protocolVersion: PROTOCOL_VERSION,
      daemonPid: process.pid,
      model: r.model,
      architecture: r.architecture,
      fingerprint: r.fingerprint,
      layouts: Object.keys(r.layouts),
      device: this.#deviceRef(),
      rank: this.#rankRef(),
    };
  }

  #getState(req: GetStateRequest, caller: Caller): string {
    if (this.#status !== 'serving') {
      throw new ServeError(
        this.#status === 'released' ? 'E_RELEASED' : 'E_RELEASING',
        `rank ${this.rank.globalRank}'s cache on device ${this.rank.device.uuid} ${this.#status === 'released' ? 'was released' : 'is being released'}; load the weights from disk (or restart weightd to cache them again)`,
      );
    }
    if (req.fingerprint !== this.rank.fingerprint) {
      const reply: MismatchReply = {
        id: req.id,
        ok: true,
        status: 'mismatch',
        fields: differingFingerprintFields(this.rank.fingerprintFields, req.fingerprintFields),
        fingerprint: this.rank.fingerprint,
        fingerprintFields: this.rank.fingerprintFields,
      };
      this.#log.info({ peerPid: caller.pid, fields: reply.fields, client: req.client }, 'fingerprint mismatch: the client will load from disk');
      return JSON.stringify(reply);
    }
    const layout = req.layout ?? 'checkpoint';
    const manifest = this.#manifestJson.get(layout);
    if (manifest === undefined) {
      const served = [...this.#manifestJson.keys()];
      const fix = (LAYOUT_NAMES as readonly string[]).includes(layout) ? `, or restart weightd with --layouts ${[...served, layout].join(',')}` : ` (weightd has the layouts ${LAYOUT_NAMES.join(', ')})`;
      throw new ServeError('E_UNKNOWN_LAYOUT', `layout "${layout}" is not served by this daemon, which planned ${served.join(', ')}; ask for one of those${fix}`, { layout, layouts: served });
    }
    const lease = this.#leases.grant(caller, req.mode);
    if (req.pid !== caller.pid && caller.pid > 0) {
      this.#log.debug({ claimedPid: req.pid, peerPid: caller.pid }, 'client pid differs from SO_PEERCRED (pid namespace?): the lease uses the kernel pid');
    }
    this.#logLease(lease, 'lease granted', req.client);
    // The manifest is spliced in as cached text instead of re-serialized per request.
    const head = { id: req.id, ok: true, status: 'ok', mode: req.mode, leaseId: lease.id };
    return `${JSON.stringify(head).slice(0, -1)},${manifest.slice(1)}`;
  }


  async #release(id: number, caller: Caller, force: boolean): Promise<ReleaseReply> {
    if (this.#status === 'released') return { id, ok: true, alreadyReleased: true, revoked: [] };
    if (this.#status === 'serving') {
      const others = this.#leases.othersThan(caller);
      if (others.length > 0 && !force) {
        const pids = [...new Set(others.map((l) => l.owner.pid))];
        throw new ServeError(
          'E_LEASE_HELD',
          `release refused: ${others.length} lease(s) of other clients (pid ${pids.join(', ')}) still use rank ${this.rank.globalRank}'s memory; ` +
            'they must detach (or exit) first, or pass force to revoke them (their mappings then point at freed memory)',
          { leases: others.map(leaseInfo) },
        );
      }
      const revoked = this.#leases.clear(caller);
      for (const l of revoked) this.#logLease(l, 'lease revoked by a forced release');
      this.#status = 'releasing';
      this.#log.info({ peerPid: caller.pid, force, revoked: revoked.length }, 'release requested: freeing the rank');
      this.#releasing = this.#options.release().then(
        () => {
          this.#status = 'released';
          this.#log.info({ globalRank: this.rank.globalRank }, 'rank released');
        },
        (err: unknown) => {
          // Whether any memory is left is unknown: never hand it out again.
          this.#status = 'released';
          throw new ServeError('E_RELEASE_FAILED', `freeing rank ${this.rank.globalRank} failed: ${(err as Error).message}`, {}, { cause: err });
        },
      );
      await this.#releasing;
      return { id, ok: true, alreadyReleased: false, revoked: revoked.map(leaseInfo) };
    }
    // Another client's release is in progress: answer when it ends.
    await this.#releasing;
    return { id, ok: true, alreadyReleased: true, revoked: [] };
  }

  #expireDeadLeases(): void {
    for (const l of this.#leases.expireDead()) this.#logLease(l, 'lease ended: client exited');
  }

  #logLease(l: Lease, msg: string, client?: string): void {
    this.#log.info({ lease: leaseHash(l.id), peerPid: l.owner.pid, mode: l.mode, leases: this.#leases.size, client }, msg);
  }
}
