// The socket server of one device: one Unix socket per local device, serving every model version
// resident on that device (one RankService each) to clients of the same user, with a lease per
// client. A request names its model version by fingerprint (get_state), by lease (get_segment_fds,
// detach) or not at all (ping, stats, release: the device's first serving model, as a node of one
// model always had). It wires the parts and owns their timing: the listener (socketListener.ts)
// hands it each new socket, admission (peerAdmission.ts) decides whether it is served, a
// ClientConnection frames it, and each request goes to its command's handler (handlers/).
// `listen()` takes the device lock and binds; `close()` undoes everything synchronously, at any
// point, even while `listen()` is still in progress.
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import { ClientConnection, errorReply, type ConnectionHandler } from './clientConnection.js';
import type { DeviceLock } from '../wire/deviceLock.js';
import type { Reply } from './handlers/fdReply.js';
import type { FdWriter } from '../wire/socketFdWriter.js';
import { dispatch } from './handlers/index.js';
import type { Caller } from './leaseTable.js';
import { encodeFrame } from '../wire/frameCodec.js';
import { LogLimiter } from '../wire/logLimiter.js';
import { admitPeer } from '../wire/peerAdmission.js';
import { turnAway } from '../wire/turnAway.js';
import type { ProcessedLayoutStatus, Request, ServeStatus } from '../wire/protocol.js';
import type { RankService } from './rankService.js';
import { DEFAULT_SERVE_LIMITS, serveLimits, type ServeLimits } from './serveLimits.js';
import { SocketListener } from '../wire/socketListener.js';
import { WatchTable } from './watchTable.js';
import type { DeviceServices, UpdateHost } from './deviceServices.js';
import { descriptorBudget, type ListenerShare } from '../wire/descriptorBudget.js';

/**
 * Connections of one device's socket that no other listener can take (descriptorBudget.ts): enough
 * for the engine processes of the GPU, whatever floods elsewhere. Beyond them it shares the reserve.
 */
const GUARANTEED_CONNECTIONS = 32;

export interface DeviceServerOptions {
  deviceUuid: string;
  /** Default: a private per-user directory under the temp dir (socketDir.ts). */
  socketDir?: string;
  log: Logger;
  /** A lock taken earlier (before loading, to fail fast); taken here when absent. */
  lock?: DeviceLock;
  limits?: Partial<ServeLimits>;
  /** The node's first model's name (config.models[0].name): its first version is listed first (add). */
  defaultModel?: string;
  /** The node's writers' updates (absent: the socket takes none, E_UPDATE_UNSUPPORTED). */
  updates?: UpdateHost;
}

/** One model version's counters on its device, for status and metrics. */
export interface RankServiceStats {
  status: ServeStatus;
  /** The device socket's: every model on the device shares it. */
  connections: number;
  leases: number;
  /** When a client last attached (took a lease), ms since the epoch; absent: none has yet. */
  lastAttachedAt?: number;
  /** When this version began serving here, ms since the epoch. */
  servingSince: number;
  requests: number;
  protocolErrors: number;
  refusedPeers: number;
  /** The newest version of its name that serves on this device: the one clients are pointed to. */
  current: boolean;
  /** The processed layouts published beside it (RankService.processedStatus). */
  processed: ProcessedLayoutStatus[];
}

/**
 * Connection ids, unique across every device socket of the process: the update and publish desks
 * are the node's, one for all its sockets, and know a writer's connection by its id alone, so a
 * connection closing on one GPU's socket must never be taken for one on another's.
 */
let nextConnectionId = 1;

export class DeviceServer implements ConnectionHandler, DeviceServices {
  readonly deviceUuid: string;
  readonly #log: Logger;
  readonly #options: DeviceServerOptions;
  readonly #listener: SocketListener;
  readonly #services: RankService[] = [];
  /** Open connections by id: what the server closes when it stops. */
  readonly #connections = new Map<number, ClientConnection>();
  readonly counters = { requests: 0, protocolErrors: 0, refusedPeers: 0 };
  readonly startedAt = Date.now();
  readonly watches = new WatchTable(() => this.#limits.maxWatchers);
  readonly updates: UpdateHost | undefined;
  #limits: ServeLimits = DEFAULT_SERVE_LIMITS;
  readonly #uid = process.getuid!();
  readonly #logDropped = (dropped: number) =>
    this.#log.warn({ dropped, socket: this.#listener.path }, `${dropped} more client protocol errors and refused connections were not logged`);
  /** One budget for every line a peer can cause, so no mix of misdeeds floods the log. */
  #peerLog = new LogLimiter(20, DEFAULT_SERVE_LIMITS.logWindowMs, this.#logDropped);
  #share: ListenerShare | undefined;
  #closed = false;
  #sweep: NodeJS.Timeout | undefined;

  constructor(options: DeviceServerOptions) {
    this.#options = options;
    this.deviceUuid = options.deviceUuid;
    this.#log = options.log;
    this.updates = options.updates;
    this.#listener = new SocketListener({ name: options.deviceUuid, socketDir: options.socketDir, lock: options.lock, log: options.log });
  }

  get all(): readonly RankService[] {
    return this.#services;
  }

  get connectionCount(): number {
    return this.#connections.size;
  }

  isConnected(connectionId: number): boolean {
    return this.#connections.has(connectionId);
  }

  /** The socket's path once bound. */
  get path(): string | undefined {
    return this.#listener.path;
  }

  /**
   * Serves `service` on this socket from now on (a new model version resident on the device),
   * after those added before; the first version of the node's first model goes first, so a
   * request that names no version is about it while it serves or drains (fallback), as on a
   * daemon of one model.
   */
  add(service: RankService): void {
    service.notifier = this;
    const first = service.name === this.#options.defaultModel && !this.#services.some((s) => s.name === service.name);
    if (first) this.#services.unshift(service);
    else this.#services.push(service);
  }

  /** Makes `service` the newest version of its name here (a rollback to a retained version), so clients are pointed to it. */
  promote(service: RankService): void {
    const i = this.#services.indexOf(service);
    if (i < 0) return;
    this.#services.splice(i, 1);
    this.#services.push(service);
  }

  /** Stops serving `service` (its model is gone); its leases went with its memory. Returns how many are left. */
  remove(service: RankService): number {
    const i = this.#services.indexOf(service);
    if (i >= 0) this.#services.splice(i, 1);
    service.notifier = undefined;
    return this.#services.length;
  }

  byFingerprint(fingerprint: string): RankService | undefined {
    // The same checkpoint loaded again after its earlier load was released: the live one answers.
    // Either fingerprint version names it: the sampled one (version 2) or the full one (3).
    const versions = this.#services.filter((s) => s.rank.fingerprint === fingerprint || s.rank.full?.fingerprint === fingerprint);
    return versions.find((s) => s.status === 'serving') ?? versions.find((s) => s.status === 'draining') ?? versions[0];
  }

  byLease(caller: Caller, leaseId: string): RankService | undefined {
    return this.#services.find((s) => s.leases.named(caller, leaseId) !== undefined);
  }

  fallback(): RankService | undefined {
    return this.#services.find((s) => s.status === 'serving' || s.status === 'draining') ?? this.#services[0];
  }

  newestServing(name: string): RankService | undefined {
    return this.#services.findLast((s) => s.name === name && s.status === 'serving');
  }

  /** The status of a service on this device (undefined: not served here). */
  statusOf(service: RankService): ServeStatus | undefined {
    return this.#services.includes(service) ? service.status : undefined;
  }

  stats(service: RankService): RankServiceStats {
    const current = this.newestServing(service.name) === service;
    return { status: service.status, connections: this.#connections.size, leases: service.leases.size, lastAttachedAt: service.leases.lastGrantedMs, servingSince: service.startedAt, current, processed: service.processedStatus(), ...this.counters };
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
      this.#share = descriptorBudget().share({ name: `socket of device ${this.deviceUuid}`, cap: this.#limits.maxConnections, guaranteed: GUARANTEED_CONNECTIONS, trusted: true });
      const path = await this.#listener.listen((socket) => this.#onConnection(socket));
      // Files are checked here too, so a change is found (and the model reloaded) with no client asking.
      this.#sweep = setInterval(() => {
        for (const s of this.#services) {
          s.expireDeadLeases();
          s.checkFiles().catch((err: unknown) => this.#log.error({ err }, 'checking the checkpoint files failed'));
        }
      }, this.#limits.leaseSweepMs);
      this.#sweep.unref();
      this.#log.info({ socket: path, device: this.deviceUuid }, 'serving');
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
    for (const c of this.#connections.values()) c.destroy();
    this.#listener.close();
    this.#share?.close();
    this.#share = undefined;
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
    const caller: Caller = { pid, connectionId: nextConnectionId++ };
    this.#connections.set(caller.connectionId, new ClientConnection(stream, caller, this, this.#limits, sendFds));
    this.#log.debug({ peerPid: pid, connection: caller.connectionId }, 'client connected');
  }

  /** Writes an event frame on one connection, if it is still open (ConnectionNotifier). */
  notify(connectionId: number, event: Record<string, unknown>): void {
    this.#connections.get(connectionId)?.notify(JSON.stringify({ id: null, ok: true, ...event }));
  }

  /**
   * Tells every connection that watches the service's model (watch) that this version is ready,
   * about to be dropped (with the version to move to, when one serves here), or stale.
   */
  announce(service: RankService, event: 'model_ready' | 'model_dropping' | 'model_stale', fields: Record<string, unknown> = {}): void {
    const newer = event === 'model_dropping' ? this.newestServing(service.name)?.rank.fingerprint : undefined;
    for (const connectionId of this.watches.watchersOf(service.name, event)) {
      const version = service.rank.version ?? 0;
      this.notify(connectionId, { event, model: service.name, fingerprint: service.rank.fingerprint, version, ...(newer ? { newer } : {}), ...fields });
    }
  }

  #onConnection(socket: Socket): void {
    if (this.#closed || !this.#share) {
      socket.destroy();
      return;
    }
    const admission = admitPeer(socket, { uid: this.#uid, share: this.#share });
    if (!admission.admitted) {
      if (admission.otherUser) this.counters.refusedPeers++;
      this.#peerLog.allow(() => this.#log.warn({ ...admission.fields, socket: this.#listener.path }, admission.message));
      // Our own user's client is told why, as the reply to its first request (id null), so an
      // engine can say "try again" rather than "the daemon hung up"; a stranger learns nothing
      // (admitPeer refuses another uid before it looks for room, so never as full).
      if (admission.full) {
        const why = new WeightdError('E_TOO_MANY_CONNECTIONS', `weightd refused this connection (${admission.fields.why}); try again once others close (docs/operations.md, "File descriptors")`, { limit: admission.fields.limit as number });
        turnAway(socket, encodeFrame(errorReply(null, why)));
      } else {
        socket.destroy();
      }
      return;
    }
    this.accept(socket, admission.pid);
  }

  // ConnectionHandler

  keepOpen(caller: Caller): boolean {
    return this.watches.watches(caller.connectionId) || this.#services.some((s) => s.leases.holdsBound(caller.connectionId)) || this.updates?.desk.holds(caller.connectionId) === true || this.updates?.publishes.holds(caller.connectionId) === true || this.updates?.plans.holds(caller.connectionId) === true;
  }

  closed(caller: Caller): void {
    this.#connections.delete(caller.connectionId);
    this.watches.connectionClosed(caller.connectionId);
    this.updates?.desk.connectionClosed(caller.connectionId);
    this.updates?.publishes.connectionClosed(caller.connectionId);
    this.updates?.plans.connectionClosed(caller.connectionId);
    for (const s of [...this.#services]) s.connectionClosed(caller);
    this.#log.debug({ peerPid: caller.pid, connection: caller.connectionId }, 'client disconnected');
  }

  violation(caller: Caller, err: WeightdError): void {
    this.counters.protocolErrors++;
    this.#peerLog.allow(() => this.#log.warn({ peerPid: caller.pid, connection: caller.connectionId, code: err.code }, `closed a client connection: ${err.message}`));
  }

  handle(req: Request, caller: Caller): Promise<Reply> {
    this.counters.requests++;
    return dispatch(req, this, caller);
  }
}
