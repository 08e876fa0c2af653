// A node's side of the rendezvous: join node 0's coordinator, follow the group through loading
// and readiness, and keep the membership alive while serving. It speaks to the supervisor only
// through GroupEvents, and to the coordinator only through the messages in groupMessages.ts.
//
// The membership's phases and rules are src/machines/groupMemberMachine.ts (start-up is
// all-or-nothing; once the group was ready, nothing the network does fails this node); this
// class owns the connection to node 0: it dials, turns what node 0 says into the machine's
// events, and writes what the machine's actions ask for.
import { connect } from 'node:net';
import { createActor, type Actor } from 'xstate';
import { ProtocolError, serializeError, type SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import { groupMemberMachine, type GroupMemberEvent } from '../machines/groupMemberMachine.js';
import { tokenProof } from './checkJoin.js';
import type { GroupEvent, ModelGroupJoin } from './groupEvents.js';
import type { NodeContent } from './nodeContent.js';
import { PeerSocket } from './peerSocket.js';
import type { GroupTiming } from './timing.js';
import { parseServerMessage, RDZV_PROTOCOL_VERSION, type JoinMessage, type ServerMessage } from './groupMessages.js';

/** What this node states about itself when it joins. */
export type JoinRequest = Omit<JoinMessage, 'type' | 'protocolVersion' | 'tokenProof'>;

export interface GroupMemberOptions {
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

export class GroupMember {
  readonly #o: GroupMemberOptions;
  #member: Actor<typeof groupMemberMachine> | undefined;
  /** The connection to node 0 now, if any: what any other connection says is not heard. */
  #conn: PeerSocket<ServerMessage> | undefined;
  /** Node 0's nonce on this connection, which the join's token proof answers. */
  #nonce = '';

  constructor(opts: GroupMemberOptions) {
    this.#o = opts;
  }

  /** Starts the rendezvous clock and dials node 0. */
  start(): void {
    const { host, port, join, rendezvousTimeoutMs, timing, emit } = this.#o;
    const log = this.#o.log.child({ component: 'rendezvous' });
    this.#member = createActor(
      groupMemberMachine.provide({
        actions: {
          connect: () => this.#connect(),
          send: (_, m) => void this.#conn?.send(m),
          sendJoin: () => void this.#conn?.send({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, ...join, tokenProof: tokenProof(this.#o.token, this.#nonce) }),
          closeLink: (_, { reason }) => this.#conn?.close(reason),
          destroyLink: (_, { reason, protocolError }) => this.#conn?.destroy(reason, protocolError === undefined ? undefined : new ProtocolError('E_RDZV_PROTOCOL', protocolError)),
          leave: (_, { reason }) => {
            this.#conn?.close(reason, { type: 'leaving', reason });
            this.#conn = undefined;
          },
        },
      }),
      { input: { host, port, nnodes: join.nnodes, localWorldSize: join.localWorldSize, rendezvousTimeoutMs, timing, startedAt: performance.now(), log, emit } },
    );
    // A throwing action is a bug in weightd: the node fails with it rather than wait forever. The
    // stopped machine ignores CLOSE, so its link to node 0 is dropped here, or its socket and
    // timers would outlive it.
    this.#member.subscribe({
      error: (err) => {
        this.#conn?.destroy(`this node failed: ${(err as Error).message}`);
        this.#conn = undefined;
        emit({ type: 'GROUP_FAILED', error: serializeError(err) });
      },
    });
    this.#member.start();
  }

  /** Every local rank is serving, holding `content` (compared across nodes at the barrier). */
  nodeReady(content?: NodeContent): void {
    this.#send({ type: 'NODE_READY', content });
  }

  /** This node failed locally: tell node 0 (best effort), so a starting group fails everywhere now. */
  nodeFailed(error: SerializedError): void {
    this.#send({ type: 'NODE_FAILED', error });
  }

  /** Synchronous, for an actor's cleanup. */
  close(): void {
    this.#send({ type: 'CLOSE' });
  }

  /**
   * This node planned a model that spans the group and starts loading it: join its model group
   * at node 0. Its verdict comes back as MODEL_GROUP_COMMIT or MODEL_GROUP_ABORT, at once
   * (aborted) when node 0 cannot be reached now.
   */
  modelJoin(join: ModelGroupJoin): void {
    this.#send({ type: 'MODEL_JOIN', join });
  }

  modelResident(name: string, fingerprint: string): void {
    this.#send({ type: 'MODEL_RESIDENT', name, fingerprint });
  }

  /** This node could not load the version (no fingerprint: not even plan it): the group aborts it everywhere. */
  modelFailed(name: string, fingerprint: string | undefined, error: SerializedError): void {
    this.#send({ type: 'MODEL_FAILED', name, fingerprint, error });
  }

  /** This node's files of a version that spans the group changed: node 0 has every node load it again (MODEL_GROUP_RELOAD). */
  modelStale(name: string, fingerprint: string): void {
    this.#send({ type: 'MODEL_STALE', name, fingerprint });
  }

  #send(event: GroupMemberEvent): void {
    this.#member?.send(event);
  }

  #connect(): void {
    const socket = connect({ host: this.#o.host, port: this.#o.port });
    const conn: PeerSocket<ServerMessage> = new PeerSocket(socket, {
      parse: parseServerMessage,
      timing: this.#o.timing,
      onMessage: (m) => {
        if (conn === this.#conn) this.#onMessage(m);
      },
      onClose: (reason, protocolError) => {
        if (conn !== this.#conn) return;
        this.#conn = undefined;
        this.#send({ type: 'LINK_CLOSED', reason, ...(protocolError ? { protocolError: protocolError.message } : {}) });
      },
    });
    this.#conn = conn;
    this.#nonce = '';
  }

  #onMessage(m: ServerMessage): void {
    switch (m.type) {
      case 'hello':
        this.#nonce ||= m.nonce;
        return this.#send({ type: 'HELLO' });
      case 'waiting':
        return this.#send({ type: 'WAITING', joined: m.joined, missing: m.missing });
      case 'joined':
        return this.#send({ type: 'JOINED', rankTable: m.rankTable });
      case 'group_ready':
        return this.#send({ type: 'GROUP_READY', lost: m.lost });
      case 'peer_lost':
        return this.#send({ type: 'PEER_LOST', nodeRank: m.nodeRank, reason: m.reason });
      case 'peer_back':
        return this.#send({ type: 'PEER_BACK', nodeRank: m.nodeRank });
      case 'rejected':
        return this.#send({ type: 'REJECTED', rejection: { code: m.code, message: m.message, details: m.details } });
      case 'leaving':
        return this.#send({ type: 'LEAVING', reason: m.reason });
      case 'model_waiting':
        return this.#send({ type: 'MODEL_WAITING', name: m.name, fingerprint: m.fingerprint, joined: m.joined, missing: m.missing });
      case 'model_commit':
      case 'model_abort':
        return this.#send({ type: 'MODEL_VERDICT', verdict: m });
      case 'model_reload':
        return this.#send({ type: 'MODEL_RELOAD', name: m.name, fingerprint: m.fingerprint, nodeRank: m.nodeRank });
      case 'heartbeat':
        return;
    }
  }
}
