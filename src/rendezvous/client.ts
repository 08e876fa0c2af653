// A node's side of the rendezvous: join node 0's coordinator, follow the group through loading
// and readiness, and keep the membership alive while serving. It speaks to the supervisor only
// through GroupEvents, and to the coordinator only through the messages in wire.ts.
//
// Start-up is all-or-nothing: until the group is ready once, anything wrong (a rejection, the
// timeout, the coordinator going away after accepting us) is GROUP_FAILED. After that, nothing
// the network does fails this node: losing node 0 is PEER_LOST 0, and the client keeps dialing
// node 0 (at the capped retry pace) and rejoins whatever coordinator answers there: a restarted
// node 0 forms the group again and this node, still serving, reports ready at once.
import { connect } from 'node:net';
import { ProtocolError, receivedCode, RendezvousError, serializeError, type SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import { timeoutRejection, tokenProof } from './checkJoin.js';
import type { GroupEvent, ModelGroupJoin } from './groupEvents.js';
import { PeerSocket } from './peerSocket.js';
import type { RankTableEntry } from '../wire/rankTable.js';
import type { GroupTiming } from './timing.js';
import type { NodeContent } from './nodeContent.js';
import { parseServerMessage, RDZV_PROTOCOL_VERSION, type ClientMessage, type JoinMessage, type ServerMessage } from './groupMessages.js';

/** What this node states about itself when it joins. */
export type JoinRequest = Omit<JoinMessage, 'type' | 'protocolVersion' | 'tokenProof'>;

export interface GroupClientOptions {
  /** Node 0's --master-addr and --weight-cache-master-port. */
  host: string;
  port: number;
  token?: string;
  join: JoinRequest;
  rendezvousTimeoutMs: number;
  timing: GroupTiming;
  log: Logger;
  emit: (event: GroupEvent) => void;
}

export class GroupClient {
  readonly #o: GroupClientOptions;
  readonly #log: Logger;
  readonly #where: string;
  #deadlineAt = 0;
  #deadline: NodeJS.Timeout | undefined;
  #retry: NodeJS.Timeout | undefined;
  #retryDelayMs: number;
  #lastAttemptError = 'no attempt yet';
  #conn: PeerSocket<ServerMessage> | undefined;
  /** Per connection: hello received; join answered with waiting/joined; rank table received. */
  #helloSeen = false;
  #accepted = false;
  #tableSeen = false;
  #joinedEmitted = false;
  #groupReady = false;
  #localReady = false;
  #content: NodeContent | undefined;
  #done = false;
  #waitingFor: { joined: number[]; missing: number[] } = { joined: [], missing: [] };
  /** Nodes reported lost (PEER_LOST sent, no PEER_BACK yet), with why. */
  readonly #lost = new Map<number, string>();
  #lastRefusal: string | undefined;
  /** Model groups this node joined that have no verdict yet: name -> fingerprint. */
  readonly #models = new Map<string, string>();

  constructor(opts: GroupClientOptions) {
    this.#o = opts;
    this.#log = opts.log.child({ component: 'rendezvous' });
    this.#where = `${opts.host}:${opts.port}`;
    this.#retryDelayMs = opts.timing.retryMinMs;
  }

  start(): void {
    this.#deadlineAt = performance.now() + this.#o.rendezvousTimeoutMs;
    this.#deadline = setTimeout(() => this.#onDeadline(), this.#o.rendezvousTimeoutMs);
    this.#connect();
  }

  /** Every local rank is serving, holding `content` (compared across nodes at the barrier). */
  nodeReady(content?: NodeContent): void {
    this.#localReady = true;
    this.#content = content;
    if (this.#tableSeen) void this.#conn?.send(this.#readyMessage());
  }

  #readyMessage(): ClientMessage {
    return { type: 'ready', ...(this.#content ? { content: this.#content } : {}) };
  }

  /** This node failed locally: tell node 0 (best effort), so a starting group fails everywhere now. */
  nodeFailed(error: SerializedError): void {
    if (this.#done) return;
    if (this.#helloSeen) void this.#conn?.send({ type: 'failed', code: error.code, message: error.message.slice(0, 2000) });
    this.#finish('node failed');
  }

  /** Synchronous, for an actor's cleanup. */
  close(): void {
    this.#finish('node stopped');
  }

  /**
   * This node planned a model that spans the group and starts loading it: join its model group
   * at node 0. Its verdict comes back as MODEL_GROUP_COMMIT or MODEL_GROUP_ABORT, at once
   * (aborted) when node 0 cannot be reached now.
   */
  modelJoin(join: ModelGroupJoin): void {
    const { name, fingerprint } = join;
    if (this.#models.has(name)) return this.#modelAbort(name, fingerprint, 'E_MODEL_GROUP_NOT_READY', `model "${name}" is already being loaded across the group`);
    if (!this.#groupReady || this.#conn === undefined || !this.#tableSeen || this.#lost.has(0)) {
      return this.#modelAbort(
        name,
        fingerprint,
        'E_MODEL_GROUP_COORDINATOR_LOST',
        `model "${name}" spans the group, but node 0 at ${this.#where} is not reachable now (${this.#groupReady ? 'reconnecting' : 'the group is not ready'}); ` +
          'a swap across nodes needs every node and node 0: try again once node 0 serves',
      );
    }
    this.#models.set(name, fingerprint);
    void this.#conn.send({ type: 'model_join', ...join });
  }

  modelResident(name: string, fingerprint: string): void {
    if (this.#models.get(name) === fingerprint) void this.#conn?.send({ type: 'model_resident', name, fingerprint });
  }

  /** This node could not load the version (no fingerprint: not even plan it): the group aborts it everywhere. */
  modelFailed(name: string, fingerprint: string | undefined, error: SerializedError): void {
    if (fingerprint !== undefined && this.#models.get(name) === fingerprint) this.#models.delete(name);
    if (this.#groupReady) void this.#conn?.send({ type: 'model_failed', name, fingerprint, code: error.code, message: error.message.slice(0, 2000) });
  }

  #modelVerdict(m: Extract<ServerMessage, { type: 'model_commit' | 'model_abort' }>): void {
    if (this.#models.get(m.name) !== m.fingerprint) return;
    this.#models.delete(m.name);
    if (m.type === 'model_commit') {
      this.#log.info({ model: m.name, fingerprint: m.fingerprint }, `model "${m.name}" is resident on every node: serving it`);
      this.#o.emit({ type: 'MODEL_GROUP_COMMIT', name: m.name, fingerprint: m.fingerprint });
    } else {
      this.#o.emit({ type: 'MODEL_GROUP_ABORT', name: m.name, fingerprint: m.fingerprint, error: serializeError(new RendezvousError(receivedCode(m.code), m.message, m.details ?? {})) });
    }
  }

  #modelAbort(name: string, fingerprint: string, code: 'E_MODEL_GROUP_COORDINATOR_LOST' | 'E_MODEL_GROUP_NOT_READY', message: string): void {
    this.#models.delete(name);
    this.#o.emit({ type: 'MODEL_GROUP_ABORT', name, fingerprint, error: serializeError(new RendezvousError(code, message, { host: this.#o.host, port: this.#o.port })) });
  }

  #connect(): void {
    this.#retry = undefined;
    this.#helloSeen = this.#accepted = this.#tableSeen = false;
    const socket = connect({ host: this.#o.host, port: this.#o.port });
    const conn: PeerSocket<ServerMessage> = new PeerSocket(socket, {
      parse: parseServerMessage,
      timing: this.#o.timing,
      onMessage: (m) => this.#onMessage(conn, m),
      onClose: (reason, protocolError) => this.#onClose(conn, reason, protocolError),
    });
    this.#conn = conn;
    // Something that accepts connections but never says hello is not a coordinator yet.
    const handshake = setTimeout(() => {
      if (!this.#helloSeen && this.#conn === conn) conn.destroy(`no hello within ${this.#o.timing.handshakeMs} ms`);
    }, this.#o.timing.handshakeMs);
    socket.once('close', () => clearTimeout(handshake));
  }

  #onMessage(conn: PeerSocket<ServerMessage>, m: ServerMessage): void {
    if (this.#done || conn !== this.#conn) return;
    switch (m.type) {
      case 'hello':
        if (this.#helloSeen) return conn.destroy('protocol error: a second hello', new ProtocolError('E_RDZV_PROTOCOL', 'a second hello'));
        this.#helloSeen = true;
        this.#retryDelayMs = this.#o.timing.retryMinMs;
        // A coordinator of another protocol version still reads the join's version and tells
        // every node, so send it regardless.
        void conn.send({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, ...this.#o.join, tokenProof: tokenProof(this.#o.token, m.nonce) });
        return;
      case 'waiting':
        this.#accepted = true;
        this.#waitingFor = { joined: m.joined, missing: m.missing };
        this.#log.info({ joined: m.joined, missing: m.missing }, `joined the group at ${this.#where}; waiting for node rank${m.missing.length === 1 ? '' : 's'} ${m.missing.join(', ')}`);
        this.#o.emit({ type: 'GROUP_WAITING', joined: m.joined, missing: m.missing });
        return;
      case 'joined':
        this.#accepted = this.#tableSeen = true;
        return this.#onTable(m.rankTable);
      case 'group_ready':
        return this.#onGroupReady(m.lost);
      case 'peer_lost':
        if (this.#groupReady) this.#markLost(m.nodeRank, m.reason);
        return;
      case 'peer_back':
        if (this.#groupReady) this.#markBack(m.nodeRank);
        return;
      case 'rejected':
        return this.#onRejected(conn, new RendezvousError(receivedCode(m.code), m.message, m.details ?? {}));
      case 'leaving':
        conn.close(`node 0 said: ${m.reason}`);
        return;
      case 'model_waiting':
        if (this.#models.get(m.name) === m.fingerprint) {
          this.#log.info({ model: m.name, joined: m.joined, missing: m.missing }, `model "${m.name}": waiting for node rank${m.missing.length === 1 ? '' : 's'} ${m.missing.join(', ')} to load it too`);
        }
        return;
      case 'model_commit':
      case 'model_abort':
        return this.#modelVerdict(m);
      case 'heartbeat':
        return;
    }
  }

  #onTable(rankTable: RankTableEntry[]): void {
    if (this.#deadline) clearTimeout(this.#deadline);
    if (this.#groupReady) {
      this.#log.info({ rankTable }, `rejoined the group at ${this.#where}; still serving, reporting ready`);
    } else if (!this.#joinedEmitted) {
      this.#joinedEmitted = true;
      this.#log.info({ rankTable }, `every node joined: global rank table (global = node_rank * ${this.#o.join.localWorldSize} + local_rank)`);
      this.#o.emit({ type: 'GROUP_JOINED', rankTable });
    }
    if (this.#localReady) void this.#conn?.send(this.#readyMessage());
  }

  #onGroupReady(lost: number[]): void {
    this.#lastRefusal = undefined;
    if (!this.#groupReady) {
      this.#groupReady = true;
      this.#log.info({ nnodes: this.#o.join.nnodes }, 'group ready: every node is serving');
      this.#o.emit({ type: 'GROUP_READY' });
      for (const r of lost) this.#markLost(r, 'lost before this node joined');
      return;
    }
    // Back in a group after losing node 0: bring the lost set in line with the coordinator's.
    for (const r of [...this.#lost.keys()]) if (!lost.includes(r)) this.#markBack(r);
    for (const r of lost) this.#markLost(r, 'lost while this node was cut off from node 0');
  }

  #markLost(nodeRank: number, reason: string): void {
    if (this.#lost.has(nodeRank)) return;
    this.#lost.set(nodeRank, reason);
    this.#log.warn({ peer: nodeRank, reason }, `node ${nodeRank} lost; this node keeps serving`);
    this.#o.emit({ type: 'PEER_LOST', nodeRank, reason });
  }

  #markBack(nodeRank: number): void {
    if (!this.#lost.delete(nodeRank)) return;
    this.#log.info({ peer: nodeRank }, `node ${nodeRank} is back and serving`);
    this.#o.emit({ type: 'PEER_BACK', nodeRank });
  }

  #onRejected(conn: PeerSocket<ServerMessage>, error: RendezvousError): void {
    if (!this.#groupReady) return this.#fail(error);
    // Already serving: a refused rejoin (node 0 restarted with another checkpoint, or still
    // holding our old connection) changes nothing here. Keep trying at the slow pace.
    if (error.message !== this.#lastRefusal) this.#log.warn({ code: error.code }, `node 0 refused this node's rejoin (retrying): ${error.message}`);
    this.#lastRefusal = error.message;
    this.#retryDelayMs = this.#o.timing.retryMaxMs;
    conn.close(`rejoin refused: ${error.code}`);
  }

  #onClose(conn: PeerSocket<ServerMessage>, reason: string, protocolError?: ProtocolError): void {
    if (this.#done || conn !== this.#conn) return;
    this.#conn = undefined;
    if (!this.#helloSeen) {
      this.#lastAttemptError = reason;
      if (protocolError && !this.#groupReady) {
        return this.#fail(
          new RendezvousError(
            'E_RDZV_NOT_WEIGHTD',
            `${this.#where} does not speak the weightd rendezvous protocol (${protocolError.message}); something else listens there: ` +
              "check --master-addr (node 0's address) and --weight-cache-master-port (the same on every node, not the engine's --master-port)",
            { host: this.#o.host, port: this.#o.port },
          ),
        );
      }
      return this.#scheduleRetry();
    }
    if (this.#groupReady) {
      // A verdict can no longer reach this node: what it loads across the group is freed here.
      for (const [name, fingerprint] of [...this.#models]) {
        this.#modelAbort(name, fingerprint, 'E_MODEL_GROUP_COORDINATOR_LOST', `model "${name}": the connection to node 0 at ${this.#where} was lost during its load (${reason}); it was not served, the older version serves on`);
      }
      if (!this.#lost.has(0)) {
        this.#markLost(0, `connection to node 0 lost (${reason})`);
        this.#log.info(`reconnecting to node 0 at ${this.#where} in the background`);
      }
      return this.#scheduleRetry();
    }
    // Not accepted yet: node 0 may just be restarting; the join is retried within the deadline.
    if (!this.#accepted) return this.#scheduleRetry();
    this.#fail(
      new RendezvousError(
        'E_RDZV_COORDINATOR_LOST',
        `lost the connection to node 0 at ${this.#where} before the group was ready (${reason}); start-up is all-or-nothing, ` +
          "so every node fails: see node 0's log for why, then restart every node",
        { host: this.#o.host, port: this.#o.port, reason },
      ),
    );
  }

  #scheduleRetry(): void {
    let delay = this.#retryDelayMs;
    if (!this.#groupReady) {
      const left = this.#deadlineAt - performance.now();
      if (left <= 0) return this.#onDeadline();
      delay = Math.min(delay, left);
    }
    this.#retryDelayMs = Math.min(this.#retryDelayMs * 2, this.#o.timing.retryMaxMs);
    // Jitter, so nodes that lost node 0 together do not all dial it in the same millisecond.
    this.#retry = setTimeout(() => this.#connect(), Math.round(delay * (0.75 + Math.random() * 0.25)));
    this.#log.debug({ delayMs: Math.round(delay), lastError: this.#lastAttemptError }, 'node 0 not reachable yet; retrying');
  }

  #onDeadline(): void {
    if (this.#done || this.#tableSeen || this.#joinedEmitted) return;
    if (this.#accepted) {
      // Connected, but the group never completed: say which nodes are missing, and tell node 0
      // why this node gives up, so the others fail with the same reason now.
      const r = timeoutRejection(this.#o.rendezvousTimeoutMs, this.#o.join.nnodes, this.#waitingFor.joined);
      void this.#conn?.send({ type: 'failed', code: r.code, message: r.message });
      return this.#fail(new RendezvousError(r.code, r.message, r.details));
    }
    this.#fail(
      new RendezvousError(
        'E_RDZV_TIMEOUT',
        `rendezvous timed out after ${this.#o.rendezvousTimeoutMs / 1000} s: node 0 at ${this.#where} never answered (last attempt: ${this.#lastAttemptError}); ` +
          `start node 0 with --node-rank 0 --master-addr ${this.#o.host} --weight-cache-master-port ${this.#o.port}, check that this node can reach it ` +
          '(routes, firewall), or raise --rendezvous-timeout',
        { field: 'nodeRank', missing: [0], host: this.#o.host, port: this.#o.port },
      ),
    );
  }

  #fail(error: RendezvousError): void {
    if (this.#done) return;
    this.#finish('group failed');
    this.#o.emit({ type: 'GROUP_FAILED', error: serializeError(error) });
  }

  #finish(reason: string): void {
    if (this.#done) return;
    this.#done = true;
    if (this.#deadline) clearTimeout(this.#deadline);
    if (this.#retry) clearTimeout(this.#retry);
    this.#conn?.close(reason, { type: 'leaving', reason });
    this.#conn = undefined;
  }
}

export interface StartupFailureReport {
  host: string;
  port: number;
  token?: string;
  nodeRank: number;
  hostName: string;
  error: SerializedError;
  timing: GroupTiming;
  /** Give up after this long: the node is exiting anyway. */
  timeoutMs: number;
}

/**
 * Tells node 0 that this node failed before it could join, so a starting group fails now
 * instead of at its rendezvous timeout. Node 0 may still be planning, so connecting is retried
 * (with the join's backoff) until `timeoutMs`. Best effort: resolves true once the report was
 * sent, false when node 0 could not be reached in time (it then names this node as missing).
 */
export async function reportStartupFailure(r: StartupFailureReport): Promise<boolean> {
  const deadline = performance.now() + r.timeoutMs;
  for (let delay = r.timing.retryMinMs; ; delay = Math.min(delay * 2, r.timing.retryMaxMs)) {
    const left = deadline - performance.now();
    if (left <= 0) return false;
    if (await sendStartupFailure(r, left)) return true;
    await new Promise((resolve) => setTimeout(resolve, Math.min(delay, Math.max(0, deadline - performance.now()))));
  }
}

/** One attempt: connect, wait for hello, send the report. */
function sendStartupFailure(r: StartupFailureReport, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    let sent = false;
    const socket = connect({ host: r.host, port: r.port });
    const conn: PeerSocket<ServerMessage> = new PeerSocket(socket, {
      parse: parseServerMessage,
      timing: r.timing,
      onMessage: (m) => {
        if (m.type !== 'hello' || sent) return;
        sent = true;
        const message = { type: 'abort', nodeRank: r.nodeRank, hostName: r.hostName, tokenProof: tokenProof(r.token, m.nonce), code: r.error.code, message: r.error.message.slice(0, 2000) } as const;
        void conn.send(message).then(() => conn.close('reported a start-up failure'));
      },
      onClose: () => {
        clearTimeout(timer);
        resolve(sent);
      },
    });
    const timer = setTimeout(() => conn.destroy('no answer from node 0 in time'), timeoutMs);
  });
}
