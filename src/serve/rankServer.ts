// The socket server of one resident rank: one Unix socket per local device, serving the manifest
// and segment handles to clients of the same user, with a lease per client. It wires the parts
// and owns their timing: the listener (socketListener.ts) hands it each new socket, admission
// (peerAdmission.ts) decides whether it is served, a ClientConnection frames it, and each
// request goes to its command's handler (handlers/) over the rank's state (rankService.ts).
// `listen()` takes the device lock and binds; `close()` undoes everything synchronously, at any
// point, even while `listen()` is still in progress.
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import { ClientConnection, type ConnectionHandler } from './clientConnection.js';
import type { DeviceLock } from './deviceLock.js';
import type { Reply } from './handlers/fdReply.js';
import type { FdWriter } from './socketFdWriter.js';
import { dispatch } from './handlers/index.js';
import type { Caller } from './leaseTable.js';
import { LogLimiter } from './logLimiter.js';
import { admitPeer } from './peerAdmission.js';
import type { Request, ServeStatus } from './protocol.js';
import { RankService, type RankServiceStats } from './rankService.js';
import type { ServedRank } from './servedRank.js';
import { DEFAULT_SERVE_LIMITS, serveLimits, type ServeLimits } from './serveLimits.js';
import { SocketListener } from './socketListener.js';

export interface RankServerOptions {
  rank: ServedRank;
  /** Default: a private per-user directory under the temp dir (socketDir.ts). */
  socketDir?: string;
  log: Logger;
  /** Frees the rank's memory; resolves once it is freed. Called at most once. */
  freeMemory: () => Promise<void>;
  /** A lock taken earlier (before loading, to fail fast); taken here when absent. */
  lock?: DeviceLock;
  limits?: Partial<ServeLimits>;
}

export class RankServer implements ConnectionHandler {
  readonly rank: ServedRank;
  readonly #log: Logger;
  readonly #options: RankServerOptions;
  readonly #service: RankService;
  readonly #listener: SocketListener;
  #limits: ServeLimits = DEFAULT_SERVE_LIMITS;
  readonly #uid = process.getuid!();
  readonly #logDropped = (dropped: number) =>
    this.#log.warn({ dropped, socket: this.#listener.path }, `${dropped} more client protocol errors and refused connections were not logged`);
  /** One budget for every line a peer can cause, so no mix of misdeeds floods the log. */
  #peerLog = new LogLimiter(20, DEFAULT_SERVE_LIMITS.logWindowMs, this.#logDropped);
  #nextConnectionId = 1;
  #closed = false;
  #sweep: NodeJS.Timeout | undefined;

  constructor(options: RankServerOptions) {
    this.#options = options;
    this.rank = options.rank;
    this.#log = options.log;
    this.#service = new RankService({ rank: options.rank, log: options.log, freeMemory: options.freeMemory });
    this.#listener = new SocketListener({ deviceUuid: options.rank.device.uuid, socketDir: options.socketDir, lock: options.lock, log: options.log });
  }

  get status(): ServeStatus {
    return this.#service.status;
  }

  stats(): RankServiceStats {
    return this.#service.stats();
  }

  /**
   * Checks the directory, takes the device lock, clears a stale socket, binds. On failure
   * everything taken so far is let go (the server is closed) before the error is thrown.
   */
  async listen(): Promise<string> {
    try {
      // Read here, not in the constructor: a bad environment value fails listen(), as a start-up error.
      this.#limits = serveLimits(this.#options.limits);
      this.#peerLog = new LogLimiter(20, this.#limits.logWindowMs, this.#logDropped);
      const path = await this.#listener.listen((socket) => this.#onConnection(socket));
      this.#sweep = setInterval(() => this.#service.expireDeadLeases(), this.#limits.leaseSweepMs);
      this.#sweep.unref();
      this.#log.info({ socket: path, device: this.rank.device.uuid, globalRank: this.rank.globalRank, tensors: this.rank.tensors.length }, 'serving');
      return path;
    } catch (err) {
      this.close();
      throw err;
    }
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
    for (const c of this.#service.connections.values()) c.destroy();
    this.#listener.close();
  }

  /**
   * Serves an admitted peer over `stream`: a socket from the listener, or (in tests) one end of
   * an in-memory pair, as aedes' broker.handle() takes any duplex stream. `sendFds` writes
   * replies with descriptors (ClientConnection's default: on the socket's fd).
   */
  accept(stream: Duplex, pid: number, sendFds?: FdWriter): void {
    if (this.#closed) {
      stream.destroy();
      return;
    }
    const caller: Caller = { pid, connectionId: this.#nextConnectionId++ };
    this.#service.connections.set(caller.connectionId, new ClientConnection(stream, caller, this, this.#limits, sendFds));
    this.#log.debug({ peerPid: pid, connection: caller.connectionId }, 'client connected');
  }

  #onConnection(socket: Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    const admission = admitPeer(socket, { uid: this.#uid, openConnections: this.#service.connections.size, maxConnections: this.#limits.maxConnections });
    if (!admission.admitted) {
      if (admission.otherUser) this.#service.counters.refusedPeers++;
      this.#peerLog.allow(() => this.#log.warn({ ...admission.fields, socket: this.#listener.path }, admission.message));
      socket.destroy();
      return;
    }
    this.accept(socket, admission.pid);
  }

  // ConnectionHandler

  keepOpen(caller: Caller): boolean {
    return this.#service.leases.holdsBound(caller.connectionId);
  }

  closed(caller: Caller): void {
    this.#service.connectionClosed(caller);
    this.#log.debug({ peerPid: caller.pid, connection: caller.connectionId }, 'client disconnected');
  }

  violation(caller: Caller, err: WeightdError): void {
    this.#service.counters.protocolErrors++;
    this.#peerLog.allow(() => this.#log.warn({ peerPid: caller.pid, connection: caller.connectionId, code: err.code }, `closed a client connection: ${err.message}`));
  }

  handle(req: Request, caller: Caller): Promise<Reply> {
    this.#service.counters.requests++;
    return dispatch(req, this.#service, caller);
  }
}
