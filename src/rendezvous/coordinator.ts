// The rendezvous coordinator, run by node 0 on --master-addr:--weight-cache-master-port for as
// long as node 0 lives. Every node, node 0 included, joins it over TCP.
//
// Phases: gathering (joins are checked as they come; a broken rule or the rendezvous timeout
// fails the group) -> loading (the rank table is out; any node failing or vanishing fails the
// group) -> serving (everyone was ready once; a lost node is only reported, and the same node
// rank may rejoin). A failed group keeps answering joins with its verdict until every node has
// heard it, so a node that starts late learns the real cause instead of timing out.
import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { errorCode, RendezvousError, type ProtocolError } from '../errors.js';
import type { Logger } from '../log.js';
import { checkJoin, describeNode, rejectVersion, timeoutRejection, tokenAccepted, type GroupExpectation, type NodeIdentity, type Rejection } from './checkJoin.js';
import { LogLimiter } from '../serve/logLimiter.js';
import { PeerSocket } from './peerSocket.js';
import { groupRankTable, type RankTableEntry } from './rankTable.js';
import type { GroupTiming } from './timing.js';
import { parseClientMessage, RDZV_PROTOCOL_VERSION, type ClientMessage, type JoinMessage, type ServerMessage } from './wire.js';

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

export type CoordinatorPhase = 'gathering' | 'loading' | 'serving' | 'failed';

interface Member extends NodeIdentity {
  link: Link;
  state: 'joined' | 'ready' | 'lost';
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
  conn: PeerSocket<ReturnType<typeof parseClientMessage>>;
  /** The peer's IP address, for the pending budget. */
  address: string;
  nonce: string;
  handshake: NodeJS.Timeout;
  /** The node rank its join claimed; set once a join arrived, accepted or not. */
  claimedRank?: number;
  member?: Member;
}

export class Coordinator {
  readonly host: string;
  readonly port: number;
  readonly #opts: CoordinatorOptions;
  readonly #log: Logger;
  readonly #server: Server;
  readonly #links = new Set<Link>();
  /** Links with no join yet, oldest first (a Set keeps insertion order). */
  readonly #pending = new Set<Link>();
  /** Lines strangers can cause (dropped, evicted, turned away): 20 per window, then a count. */
  readonly #strangerLog: LogLimiter;
  readonly #members = new Map<number, Member>();
  readonly #deadline: NodeJS.Timeout;
  /** Set by the timer itself: a timer may fire a little before performance.now() reaches its time. */
  #deadlinePassed = false;
  #phase: CoordinatorPhase = 'gathering';
  #rankTable: RankTableEntry[] = [];
  #verdict: Rejection | undefined;
  /** Joins refused for want of a valid token, named in a timeout verdict. */
  readonly #turnedAway: string[] = [];
  /** Node ranks that have been sent the verdict. */
  readonly #told = new Set<number>();
  #pendingTells = 0;
  #delivered!: () => void;
  readonly #verdictDelivered = new Promise<void>((resolve) => (this.#delivered = resolve));
  #closed = false;

  /** Binds to host:port and starts the rendezvous clock; rejects with RendezvousError E_RDZV_LISTEN. */
  static listen(opts: CoordinatorOptions): Promise<Coordinator> {
    // No server.maxConnections: a cap counted over every connection is one a stranger can fill;
    // connections that have not joined are bounded by PENDING_BUDGET instead.
    const server = createServer();
    return new Promise((resolve, reject) => {
      server.once('error', (err) => reject(listenError(opts, err)));
      server.listen({ host: opts.host, port: opts.port }, () => {
        server.removeAllListeners('error');
        resolve(new Coordinator(server, opts));
      });
    });
  }

  private constructor(server: Server, opts: CoordinatorOptions) {
    this.#server = server;
    this.#opts = opts;
    this.#log = opts.log.child({ component: 'coordinator' });
    this.#strangerLog = new LogLimiter(20, 10_000, (dropped) => this.#log.warn({ dropped }, `${dropped} more dropped, evicted or turned-away rendezvous connections were not logged`));
    const address = server.address() as { address: string; port: number };
    this.host = address.address;
    this.port = address.port;
    server.on('connection', (socket) => this.#onConnection(socket));
    server.on('error', (err) => this.#log.error({ err: errorCode(err) ?? err.message }, 'rendezvous coordinator socket error'));
    this.#deadline = setTimeout(() => this.#onDeadline(), opts.rendezvousTimeoutMs);
    this.#log.info({ addr: this.host, port: this.port, nnodes: opts.expect.nnodes, timeoutS: opts.rendezvousTimeoutMs / 1000 }, 'rendezvous coordinator listening');
  }

  get phase(): CoordinatorPhase {
    return this.#phase;
  }

  get rankTable(): RankTableEntry[] {
    return this.#rankTable;
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
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#deadline);
    this.#server.close();
    this.#strangerLog.flush();
    for (const link of this.#links) {
      clearTimeout(link.handshake);
      link.conn.close('coordinator closed', { type: 'leaving', reason: 'node 0 stopped' });
    }
    this.#delivered();
  }

  #onConnection(socket: Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    const nonce = randomBytes(24).toString('base64');
    const link: Link = {
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
    if (this.#pending.size >= PENDING_BUDGET) this.#evictPending();
    this.#links.add(link);
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
    if ('foreignVersion' in parsed) {
      this.#onJoin(link, parsed.nodeRank, rejectVersion({ nodeRank: parsed.nodeRank, hostName: parsed.hostName, address: link.conn.remote }, parsed.foreignVersion));
      return;
    }
    const m: ClientMessage = parsed.message;
    if (m.type === 'heartbeat') return;
    if (m.type === 'join') {
      if (link.claimedRank !== undefined) return this.#protocolViolation(link, 'a second join on one connection');
      this.#onJoin(link, m.nodeRank, undefined, m);
      return;
    }
    if (m.type === 'leaving') {
      link.conn.close(`left: ${m.reason}`);
      return;
    }
    if (m.type === 'abort') {
      this.#onAbort(link, m);
      return;
    }
    // A failed group only answers joins; whatever else its nodes still say changes nothing.
    if (this.#phase === 'failed') return;
    const member = link.member;
    if (!member || member.state === 'lost') return this.#protocolViolation(link, `"${m.type}" before an accepted join`);
    if (m.type === 'ready') this.#onReady(member);
    else this.reportFailure(member.nodeRank, m.code, m.message);
  }

  /** A node that failed before joining; like a join, it counts only with a valid token. */
  #onAbort(link: Link, m: Extract<ClientMessage, { type: 'abort' }>): void {
    this.#settle(link);
    const node = describeNode({ nodeRank: m.nodeRank, hostName: m.hostName, address: link.conn.remote });
    const token = this.#opts.expect.token;
    if (token !== undefined && !tokenAccepted(token, link.nonce, m.tokenProof)) {
      this.#turnedAway.push(`${node} (E_RDZV_TOKEN)`);
      this.#strangerLog.allow(() => this.#log.warn({ peer: m.nodeRank, remote: link.conn.remote }, `ignored a start-up failure report without a valid token from ${node}`));
      link.conn.close('rejected: E_RDZV_TOKEN');
      return;
    }
    if (this.#phase !== 'gathering' && this.#phase !== 'loading') {
      // A serving group is not failed by a node that could not start.
      this.#log.warn({ peer: m.nodeRank, code: m.code }, `${node} could not start: ${m.message}`);
      link.conn.close('noted');
      return;
    }
    link.claimedRank = m.nodeRank;
    this.#fail({
      code: 'E_RDZV_PEER_FAILED',
      message: `${node} failed before joining: ${m.code}: ${m.message}`,
      details: { nodeRank: m.nodeRank, field: 'node', causeCode: m.code },
    });
  }

  #protocolViolation(link: Link, what: string): void {
    this.#log.warn({ remote: link.conn.remote, peer: link.claimedRank }, `closed a rendezvous connection that sent ${what}`);
    link.conn.destroy(`protocol error: ${what}`);
  }

  /** A join (`join`), or one already known to be rejected (`rejection`, a foreign version). */
  #onJoin(link: Link, nodeRank: number | undefined, rejection: Rejection | undefined, join?: JoinMessage): void {
    this.#settle(link);
    const token = this.#opts.expect.token;
    if (token !== undefined && !(join && tokenAccepted(token, link.nonce, join.tokenProof))) {
      // With a token, only a node that proves it may decide the group's fate or hear its
      // verdict: anyone else who can reach the port is turned away alone, so a stranger cannot
      // fail a loading cluster. A real node with a wrong token fails by itself, and the others
      // name it when their rendezvous times out.
      const refusal = rejection ?? checkJoin(join!, link.conn.remote, this.#opts.expect, link.nonce, [])!;
      this.#turnedAway.push(`${describeNode({ nodeRank: nodeRank ?? -1, address: link.conn.remote })} (${refusal.code})`);
      this.#strangerLog.allow(() => this.#log.warn({ code: refusal.code, peer: nodeRank, remote: link.conn.remote }, `turned away a join without a valid token: ${refusal.message}`));
      void link.conn.send({ type: 'rejected', ...refusal }).then(() => link.conn.close(`rejected: ${refusal.code}`));
      return;
    }
    link.claimedRank = nodeRank ?? -1;
    if (this.#phase === 'failed') {
      void this.#tell(link);
      return;
    }
    const previous = join ? this.#members.get(join.nodeRank) : undefined;
    // While serving, the same node rank may come back once its old connection is known lost.
    const rejoin = this.#phase === 'serving' && previous?.state === 'lost';
    const others = [...this.#members.values()].filter((m) => !(rejoin && m === previous));
    rejection ??= checkJoin(join!, link.conn.remote, this.#opts.expect, link.nonce, others);
    if (rejection) {
      if (this.#phase === 'serving') {
        // A serving group is not failed by a bad newcomer: only that node hears why.
        this.#log.warn({ code: rejection.code, peer: nodeRank }, `refused a join: ${rejection.message}`);
        void link.conn.send({ type: 'rejected', ...rejection }).then(() => link.conn.close(`rejected: ${rejection.code}`));
        return;
      }
      this.#fail(rejection);
      return;
    }
    const j = join!;
    const member: Member = { nodeRank: j.nodeRank, hostName: j.hostName, address: link.conn.remote, deviceUuids: j.deviceUuids, link, state: 'joined' };
    link.member = member;
    this.#members.set(j.nodeRank, member);
    if (rejoin) {
      this.#rankTable = groupRankTable([...this.#members.values()]);
      this.#log.info({ peer: j.nodeRank, host: j.hostName, remote: member.address }, `${describeNode(member)} is rejoining; it loads, then reports ready`);
      void link.conn.send({ type: 'joined', rankTable: this.#rankTable });
      return;
    }
    const joined = [...this.#members.keys()].sort((a, b) => a - b);
    this.#log.info({ peer: j.nodeRank, host: j.hostName, remote: member.address, joined: joined.length, of: this.#opts.expect.nnodes }, `${describeNode(member)} joined`);
    if (joined.length < this.#opts.expect.nnodes) {
      const missing = Array.from({ length: this.#opts.expect.nnodes }, (_, r) => r).filter((r) => !this.#members.has(r));
      this.#broadcast({ type: 'waiting', joined, missing });
      return;
    }
    this.#phase = 'loading';
    clearTimeout(this.#deadline);
    this.#rankTable = groupRankTable([...this.#members.values()]);
    this.#log.info({ ranks: this.#rankTable.length }, 'every node joined: rank table published');
    this.#broadcast({ type: 'joined', rankTable: this.#rankTable });
  }

  #onReady(member: Member): void {
    if (member.state !== 'joined') return;
    if (this.#phase === 'gathering') return this.#protocolViolation(member.link, '"ready" before the rank table');
    member.state = 'ready';
    if (this.#phase === 'loading') {
      if ([...this.#members.values()].some((m) => m.state !== 'ready')) return;
      this.#phase = 'serving';
      this.#log.info({ nnodes: this.#opts.expect.nnodes }, 'every node reported ready: group-ready sent to all');
      this.#broadcast({ type: 'group_ready', lost: [] });
      return;
    }
    const lost = [...this.#members.values()].filter((m) => m.state === 'lost').map((m) => m.nodeRank);
    this.#log.info({ peer: member.nodeRank }, `${describeNode(member)} rejoined and is serving`);
    void member.link.conn.send({ type: 'group_ready', lost });
    this.#broadcast({ type: 'peer_back', nodeRank: member.nodeRank }, member);
  }

  /**
   * A node failed locally. Node 0 calls this directly for its own failure: its process ends
   * right after, before its own "failed" frame could make the round trip through TCP.
   */
  reportFailure(nodeRank: number, code: string, message: string): void {
    const member = this.#members.get(nodeRank);
    if (this.#phase === 'failed' || member?.state === 'lost') return;
    if (this.#phase === 'serving') {
      if (!member) return;
      this.#lose(member, `failed: ${message}`);
      member.link.conn.close('node failed');
      return;
    }
    if (this.#phase === 'gathering' && code === 'E_RDZV_TIMEOUT') {
      // That node's clock ran out before ours (it started earlier): the same verdict either way,
      // and this side knows exactly which nodes are missing.
      this.#fail(timeoutRejection(this.#opts.rendezvousTimeoutMs, this.#opts.expect.nnodes, [...this.#members.keys()], this.#turnedAway));
      return;
    }
    this.#fail({
      code: 'E_RDZV_PEER_FAILED',
      message: `${describeNode(member ?? { nodeRank })} failed: ${message}`,
      details: { nodeRank, field: 'node', causeCode: code },
    });
  }

  #onClose(link: Link, reason: string, protocolError?: ProtocolError): void {
    this.#settle(link);
    this.#links.delete(link);
    if (protocolError) {
      // Something that does not speak this protocol (a port scanner, an engine pointed at the
      // wrong port): dropping it is enough, the group is not at fault.
      this.#strangerLog.allow(() =>
        this.#log.warn({ remote: link.conn.remote, code: protocolError.code, peer: link.member?.nodeRank }, `dropped a rendezvous connection: ${protocolError.message}`),
      );
    }
    const member = link.member;
    if (this.#closed || !member || member.link !== link || member.state === 'lost') return;
    if (this.#phase === 'serving') {
      this.#lose(member, reason);
      return;
    }
    if (this.#phase === 'failed') {
      member.state = 'lost';
      this.#checkDelivered();
      return;
    }
    member.state = 'lost';
    this.#fail({
      code: 'E_RDZV_PEER_LOST',
      message:
        `${describeNode(member)} disconnected before the group was ready (${reason}); start-up is all-or-nothing, ` +
        'so every node fails: find why it stopped in its own log, then restart every node',
      details: { nodeRank: member.nodeRank, field: 'node', reason },
    });
  }

  /** While serving: the node is down; the others keep serving and are told. */
  #lose(member: Member, reason: string): void {
    const wasServing = member.state === 'ready';
    member.state = 'lost';
    if (!wasServing) {
      this.#log.warn({ peer: member.nodeRank, reason }, `${describeNode(member)} did not finish rejoining`);
      return;
    }
    this.#log.warn({ peer: member.nodeRank, reason }, `${describeNode(member)} lost; the other nodes keep serving`);
    this.#broadcast({ type: 'peer_lost', nodeRank: member.nodeRank, reason }, member);
  }

  #onDeadline(): void {
    this.#deadlinePassed = true;
    if (this.#phase === 'gathering') {
      this.#fail(timeoutRejection(this.#opts.rendezvousTimeoutMs, this.#opts.expect.nnodes, [...this.#members.keys()], this.#turnedAway));
    }
    this.#checkDelivered();
  }

  #fail(rejection: Rejection): void {
    if (this.#phase === 'failed') return;
    this.#phase = 'failed';
    this.#verdict = rejection;
    this.#log.error({ code: rejection.code, peer: rejection.details.nodeRank, field: rejection.details.field }, `group failed: ${rejection.message}`);
    for (const link of this.#links) if (link.claimedRank !== undefined) void this.#tell(link);
    this.#checkDelivered();
  }

  /** Sends the verdict, then closes: the connection has no further use. */
  async #tell(link: Link): Promise<void> {
    const rank = link.claimedRank!;
    this.#pendingTells++;
    await link.conn.send({ type: 'rejected', ...this.#verdict! });
    link.conn.close('group failed');
    this.#pendingTells--;
    if (rank >= 0) this.#told.add(rank);
    this.#checkDelivered();
  }

  #checkDelivered(): void {
    if (this.#phase !== 'failed' || this.#pendingTells > 0) return;
    const heard = (r: number) => this.#told.has(r) || this.#members.get(r)?.state === 'lost';
    const everyone = Array.from({ length: this.#opts.expect.nnodes }, (_, r) => r).every(heard);
    if (everyone || this.#deadlinePassed) {
      clearTimeout(this.#deadline);
      this.#delivered();
    }
  }

  /** To every connected node that is in the group, but `except`. */
  #broadcast(message: ServerMessage, except?: Member): void {
    for (const m of this.#members.values()) {
      if (m !== except && m.state !== 'lost') void m.link.conn.send(message);
    }
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
