// The rendezvous coordinator, run by node 0 on --master-addr:--weight-cache-master-port for as
// long as node 0 lives. Every node, node 0 included, joins it over TCP.
//
// The group's phases and rules are src/machines/coordinator.ts; this class owns the sockets:
// it takes connections in (the pending budget, the handshake clock), turns what they say into
// the machine's events, and writes what the machine's actions ask for.
import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { createActor, type Actor } from 'xstate';
import { errorCode, RendezvousError, type ProtocolError } from '../errors.js';
import type { Logger } from '../log.js';
import { stateName } from '../inspect/stateName.js';
import { coordinatorMachine, type Claim, type CoordinatorEvent, type CoordinatorPhase } from '../machines/coordinator.js';
import { ModelGroups } from './modelGroupRegistry.js';
import { descriptorBudget, type ListenerShare } from '../wire/descriptorBudget.js';
import { LogLimiter } from '../wire/logLimiter.js';
import type { GroupExpectation, Rejection } from './checkJoin.js';
import { PeerSocket } from './peerSocket.js';
import type { RankTableEntry } from '../wire/rankTable.js';
import type { GroupTiming } from './timing.js';
import { parseClientMessage, RDZV_PROTOCOL_VERSION, type ClientMessage, type ServerMessage } from './groupMessages.js';

export interface CoordinatorOptions {
  /** --master-addr: the coordinator binds to this address only. */
  host: string;
  /** --weight-cache-master-port; 0 picks a free one (tests). */
  port: number;
  expect: GroupExpectation;
  rendezvousTimeoutMs: number;
  timing: GroupTiming;
  log: Logger;
}

/**
 * Connections that have not sent a join (or abort) yet. Anyone who can reach the port can open
 * them, so they get their own budget, apart from the members (who have no cap but one link per
 * node rank): when it is full, a new connection evicts the oldest pending one of the address
 * holding the most, so a stranger's idle connections can only ever push out each other, and a
 * real node's connection, which sends its join one round trip after connecting, survives
 * anything short of this many new connections within that round trip.
 */
export const PENDING_BUDGET = 256;

/** One TCP connection, before and after its join. */
interface Link {
  /** How the machine names this connection. */
  id: number;
  conn: PeerSocket<ReturnType<typeof parseClientMessage>>;
  /** The peer's IP address, for the pending budget. */
  address: string;
  nonce: string;
  handshake: NodeJS.Timeout;
}

export class Coordinator {
  readonly host: string;
  readonly port: number;
  readonly #opts: CoordinatorOptions;
  readonly #log: Logger;
  readonly #server: Server;
  readonly #links = new Map<number, Link>();
  #nextLinkId = 0;
  /** Links with no join yet, oldest first (a Set keeps insertion order). */
  readonly #pending = new Set<Link>();
  /** Lines strangers can cause (dropped, evicted, turned away): 20 per window, then a count. */
  readonly #strangerLog: LogLimiter;
  /** Its part of the process's descriptors (TCP, open to strangers: none of the reserve). */
  readonly #share: ListenerShare;
  readonly #group: Actor<typeof coordinatorMachine>;
  /** Models loaded across the group while it serves, one swap per name (src/models/modelGroupMachine.ts). */
  readonly #models: ModelGroups;
  #delivered!: () => void;
  #socketsClosed = false;
  readonly #verdictDelivered = new Promise<void>((resolve) => (this.#delivered = resolve));

  /** Binds to host:port and starts the rendezvous clock; rejects with RendezvousError E_RDZV_LISTEN. */
  static listen(opts: CoordinatorOptions): Promise<Coordinator> {
    // No server.maxConnections: a cap counted over every connection is one a stranger can fill;
    // connections that have not joined are bounded by PENDING_BUDGET instead.
    const server = createServer();
    return new Promise((resolve, reject) => {
      server.once('error', (err) => reject(listenError(opts, err)));
      server.listen({ host: opts.host, port: opts.port }, () => {
        server.removeAllListeners('error');
        try {
          resolve(new Coordinator(server, opts));
        } catch (err) {
          server.close();
          reject(err);
        }
      });
    });
  }

  private constructor(server: Server, opts: CoordinatorOptions) {
    this.#server = server;
    this.#opts = opts;
    this.#log = opts.log.child({ component: 'coordinator' });
    // Every node's link (a rejoining node's new one beside its old), and the pending.
    const cap = PENDING_BUDGET + 2 * opts.expect.nnodes;
    // Fewer slots than nodes would turn nodes away until the rendezvous times out: fail now.
    this.#share = descriptorBudget().share({ name: 'rendezvous coordinator', cap, guaranteed: cap, trusted: false, atLeast: { count: opts.expect.nnodes, of: 'nodes (--nnodes)' } });
    this.#strangerLog = new LogLimiter(20, 10_000, (dropped) => this.#log.warn({ dropped }, `${dropped} more dropped, evicted or turned-away rendezvous connections were not logged`));
    const address = server.address() as { address: string; port: number };
    this.host = address.address;
    this.port = address.port;
    this.#group = createActor(
      coordinatorMachine.provide({
        actions: {
          send: (_, p) => this.#send(p.linkIds, p.message),
          refuse: (_, p) => this.#refuse(p.linkId, p.rejection),
          tell: (_, p) => {
            for (const claim of p.claims) void this.#tell(claim, p.verdict);
          },
          closeLink: (_, p) => this.#links.get(p.linkId)?.conn.close(p.reason),
          dropLink: (_, p) => this.#protocolViolation(p.linkId, p.what, p.peer),
        },
      }),
      { input: { expect: opts.expect, rendezvousTimeoutMs: opts.rendezvousTimeoutMs, startedAt: performance.now(), log: this.#log, strangerLog: this.#strangerLog } },
    );
    this.#group.subscribe({
      next: (snap) => {
        if (snap.status === 'done' || snap.matches({ failed: 'delivered' })) this.#delivered();
      },
      error: (err) => {
        // A bug in weightd: nothing more can be judged, so waiters are not left hanging on it.
        this.#log.error({ err }, 'rendezvous coordinator machine crashed');
        this.#delivered();
      },
    });
    this.#models = new ModelGroups({
      nnodes: opts.expect.nnodes,
      timeoutMs: opts.rendezvousTimeoutMs,
      log: this.#log,
      send: (nodeRanks, message) => this.#send(this.#memberLinks(nodeRanks), message),
    });
    server.on('connection', (socket) => this.#onConnection(socket));
    server.on('error', (err) => this.#log.error({ err: errorCode(err) ?? err.message }, 'rendezvous coordinator socket error'));
    this.#group.start();
    this.#log.info({ addr: this.host, port: this.port, nnodes: opts.expect.nnodes, timeoutS: opts.rendezvousTimeoutMs / 1000 }, 'rendezvous coordinator listening');
  }

  get phase(): CoordinatorPhase {
    return this.state.split('.')[0] as CoordinatorPhase;
  }

  /** The machine's state, "failed.informing" for a nested one. */
  get state(): string {
    return stateName(this.#group.getSnapshot().value);
  }

  get rankTable(): RankTableEntry[] {
    return this.#group.getSnapshot().context.rankTable;
  }

  /** Calls `listener` with the state now and on every change; returns the unsubscribe function. */
  onStateChange(listener: (state: string) => void): () => void {
    let last = this.state;
    listener(last);
    const sub = this.#group.subscribe((snap) => {
      const state = stateName(snap.value);
      if (state === last) return;
      last = state;
      listener(state);
    });
    return () => sub.unsubscribe();
  }

  /**
   * Resolves once a failed group's verdict reached every node that can still hear it: each node
   * rank was told or has disconnected, or the rendezvous deadline passed (a node that never
   * started cannot be told). Node 0 holds its own failure until then, or late nodes would find
   * no coordinator and time out without the cause.
   */
  verdictDelivered(): Promise<void> {
    return this.#verdictDelivered;
  }

  /** Synchronous, for an actor's cleanup: says goodbye to every node and stops listening. */
  close(): void {
    // Its own flag, not the machine's status: a machine that crashed must still let go of the
    // port and the links.
    if (this.#socketsClosed) return;
    this.#socketsClosed = true;
    this.#dispatch({ type: 'CLOSE' });
    this.#models.close();
    this.#server.close();
    this.#share.close();
    this.#strangerLog.flush();
    for (const link of this.#links.values()) {
      clearTimeout(link.handshake);
      link.conn.close('coordinator closed', { type: 'leaving', reason: 'node 0 stopped' });
    }
  }

  /**
   * A node failed locally. Node 0 calls this directly for its own failure: its process ends
   * right after, before its own "failed" frame could make the round trip through TCP.
   */
  reportFailure(nodeRank: number, code: string, message: string): void {
    this.#models.nodeLost(nodeRank, `failed: ${message}`);
    this.#dispatch({ type: 'NODE_FAILED', nodeRank, code, message });
  }

  get #closed(): boolean {
    return this.#group.getSnapshot().status !== 'active';
  }

  /** Events only reach a running machine: once closed, sockets still winding down say nothing to it. */
  #dispatch(event: CoordinatorEvent): void {
    if (!this.#closed) this.#group.send(event);
  }

  #onConnection(socket: Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    if (this.#pending.size >= PENDING_BUDGET) this.#evictPending();
    let refused = this.#share.take(socket);
    // A share spent (a low RLIMIT_NOFILE grants less than PENDING_BUDGET) evicts as a full pending
    // budget does, so that strangers cannot keep a node out either way.
    if (refused && this.#pending.size > 0) {
      this.#evictPending();
      refused = this.#share.take(socket);
    }
    if (refused) {
      this.#strangerLog.allow(() => this.#log.warn({ remote: socket.remoteAddress, limit: refused.limit }, `turned away a rendezvous connection: ${refused.message}`));
      socket.destroy();
      return;
    }
    const nonce = randomBytes(24).toString('base64');
    const link: Link = {
      id: this.#nextLinkId++,
      address: socket.remoteAddress ?? '?',
      nonce,
      conn: new PeerSocket(socket, {
        parse: parseClientMessage,
        timing: this.#opts.timing,
        onMessage: (m) => this.#onMessage(link, m),
        onClose: (reason, protocolError) => this.#onClose(link, reason, protocolError),
      }),
      handshake: setTimeout(
        () => link.conn.destroy(`no join within ${this.#opts.timing.joinMs} ms of connecting`),
        this.#opts.timing.joinMs,
      ),
    };
    this.#links.set(link.id, link);
    this.#pending.add(link);
    void link.conn.send({ type: 'hello', protocolVersion: RDZV_PROTOCOL_VERSION, nonce });
  }

  /** Makes room for one more pending link: the oldest of the address that holds the most. */
  #evictPending(): void {
    const count = new Map<string, number>();
    for (const l of this.#pending) count.set(l.address, (count.get(l.address) ?? 0) + 1);
    const most = Math.max(...count.values());
    const victim = [...this.#pending].find((l) => count.get(l.address) === most)!;
    this.#settle(victim);
    this.#strangerLog.allow(() =>
      this.#log.warn({ remote: victim.conn.remote, pending: PENDING_BUDGET }, 'evicted a rendezvous connection that had not joined, to make room for a new one'),
    );
    victim.conn.destroy(`evicted: ${PENDING_BUDGET} connections were waiting to join`);
  }

  /** The link sent its join (or abort), or is gone: it no longer counts as pending. */
  #settle(link: Link): void {
    clearTimeout(link.handshake);
    this.#pending.delete(link);
  }

  #onMessage(link: Link, parsed: ReturnType<typeof parseClientMessage>): void {
    const remote = link.conn.remote;
    if ('foreignVersion' in parsed) {
      this.#settle(link);
      this.#dispatch({ type: 'FOREIGN_JOIN', linkId: link.id, address: remote, version: parsed.foreignVersion, nodeRank: parsed.nodeRank, hostName: parsed.hostName });
      return;
    }
    const m: ClientMessage = parsed.message;
    switch (m.type) {
      case 'heartbeat':
        return;
      case 'join':
        this.#settle(link);
        this.#dispatch({ type: 'JOIN', linkId: link.id, address: remote, nonce: link.nonce, join: m });
        return;
      case 'leaving':
        link.conn.close(`left: ${m.reason}`);
        return;
      case 'abort':
        this.#settle(link);
        this.#dispatch({ type: 'ABORT', linkId: link.id, address: remote, nonce: link.nonce, tokenProof: m.tokenProof, nodeRank: m.nodeRank, hostName: m.hostName, code: m.code, message: m.message });
        return;
      case 'ready':
        this.#dispatch({ type: 'READY', linkId: link.id, content: m.content });
        return;
      case 'failed':
        this.#dispatch({ type: 'LINK_FAILED', linkId: link.id, code: m.code, message: m.message });
        return;
      case 'model_join':
      case 'model_resident':
      case 'model_failed':
        return this.#onModelMessage(link, m);
      case 'model_stale':
        return this.#onModelStale(link, m);
    }
  }

  /**
   * A node's files of a version that spans the group changed: every node loads the model again
   * (src/models/groupReload.ts), which gathers as a model group of that name. Each node reads
   * its own files, so a node whose copy did not change the same way fails that group by name.
   */
  #onModelStale(link: Link, m: Extract<ClientMessage, { type: 'model_stale' }>): void {
    const snap = this.#group.getSnapshot();
    const member = snap.context.members.find((x) => x.linkId === link.id && x.state !== 'lost');
    if (!member) return this.#protocolViolation(link.id, `"${m.type}" before an accepted join`);
    const fields = { model: m.name, fingerprint: m.fingerprint, peer: member.nodeRank };
    if (!snap.matches('serving')) {
      this.#log.error(fields, `model "${m.name}" went stale on node ${member.nodeRank}, but the group is ${this.state}, not serving: it is not loaded again; load it with weightd ctl load on every node once the group serves`);
      return;
    }
    this.#log.warn(fields, `model "${m.name}" went stale on node ${member.nodeRank}: every node loads it again from its files`);
    const everyNode = Array.from({ length: this.#opts.expect.nnodes }, (_, r) => r);
    this.#send(this.#memberLinks(everyNode), { type: 'model_reload', name: m.name, fingerprint: m.fingerprint, nodeRank: member.nodeRank });
  }

  /** A model group's message counts from a member of a serving group only. */
  #onModelMessage(link: Link, m: Extract<ClientMessage, { type: 'model_join' | 'model_resident' | 'model_failed' }>): void {
    const snap = this.#group.getSnapshot();
    const member = snap.context.members.find((x) => x.linkId === link.id && x.state !== 'lost');
    if (!member) return this.#protocolViolation(link.id, `"${m.type}" before an accepted join`);
    if (!snap.matches('serving') || member.state !== 'ready') {
      // A failure report needs no answer: that node frees its load by itself.
      if (m.type === 'model_failed') return;
      void link.conn.send({
        type: 'model_abort',
        name: m.name,
        fingerprint: m.fingerprint,
        code: 'E_MODEL_GROUP_NOT_READY',
        message: `model "${m.name}": the group is ${this.state}, not serving: a model is loaded across nodes only once every node serves; try again once the group is ready`,
      });
      return;
    }
    this.#models.receive(member.nodeRank, m);
  }

  /** The connections of these node ranks that are members and not lost. */
  #memberLinks(nodeRanks: number[]): number[] {
    return this.#group.getSnapshot().context.members.filter((m) => m.state !== 'lost' && nodeRanks.includes(m.nodeRank)).map((m) => m.linkId);
  }

  #protocolViolation(linkId: number, what: string, peer?: number): void {
    const link = this.#links.get(linkId);
    if (!link) return;
    this.#log.warn({ remote: link.conn.remote, peer }, `closed a rendezvous connection that sent ${what}`);
    link.conn.destroy(`protocol error: ${what}`);
  }

  #onClose(link: Link, reason: string, protocolError?: ProtocolError): void {
    this.#settle(link);
    this.#links.delete(link.id);
    const member = this.#group.getSnapshot().context.members.find((m) => m.linkId === link.id && m.state !== 'lost');
    if (member) this.#models.nodeLost(member.nodeRank, reason);
    if (protocolError) {
      // Something that does not speak this protocol (a port scanner, an engine pointed at the
      // wrong port): dropping it is enough, the group is not at fault.
      const peer = this.#group.getSnapshot().context.members.find((m) => m.linkId === link.id)?.nodeRank;
      this.#strangerLog.allow(() =>
        this.#log.warn({ remote: link.conn.remote, code: protocolError.code, peer }, `dropped a rendezvous connection: ${protocolError.message}`),
      );
    }
    this.#dispatch({ type: 'LINK_CLOSED', linkId: link.id, reason });
  }

  #send(linkIds: number[], message: ServerMessage): void {
    for (const id of linkIds) void this.#links.get(id)?.conn.send(message);
  }

  #refuse(linkId: number, rejection: Rejection): void {
    const link = this.#links.get(linkId);
    void link?.conn.send({ type: 'rejected', ...rejection }).then(() => link.conn.close(`rejected: ${rejection.code}`));
  }

  /** Sends the verdict, then closes: the connection has no further use. */
  async #tell(claim: Claim, verdict: Rejection): Promise<void> {
    // Claims are forgotten when their link closes, so the link is still here.
    const link = this.#links.get(claim.linkId)!;
    await link.conn.send({ type: 'rejected', ...verdict });
    link.conn.close('group failed');
    this.#dispatch({ type: 'VERDICT_SENT', linkId: claim.linkId, nodeRank: claim.nodeRank });
  }
}

function listenError(opts: CoordinatorOptions, err: Error): RendezvousError {
  const code = errorCode(err);
  const where = `${opts.host}:${opts.port}`;
  const fix =
    code === 'EADDRINUSE'
      ? 'another process (an older weightd, or the engine) holds that port: pick a free --weight-cache-master-port, the same on every node, different from --master-port'
      : code === 'EADDRNOTAVAIL'
        ? "node 0 listens on --master-addr, so it must be one of node 0's own addresses: pass the address the other nodes reach node 0 at"
        : code === 'ENOTFOUND' || code === 'EAI_AGAIN'
          ? '--master-addr does not resolve on node 0: pass an IP address or a host name it can resolve'
          : code === 'EACCES'
            ? 'a port below 1024 needs privileges: pick a --weight-cache-master-port from 1024 up'
            : 'check --master-addr and --weight-cache-master-port';
  return new RendezvousError('E_RDZV_LISTEN', `node 0 cannot listen for the rendezvous on ${where} (${code ?? err.message}): ${fix}`, { host: opts.host, port: opts.port, cause: code });
}
