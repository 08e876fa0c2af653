// A node's membership of its group, the member side of the rendezvous, as a state machine that
// mirrors node 0's coordinator (src/machines/coordinator.ts):
//
//   starting: connect to node 0 (connecting), say hello and join (joining), wait for the other
//             nodes (waiting), retrying between attempts. All-or-nothing: a rejection, the
//             rendezvous deadline, or losing node 0 once it accepted the join fails the group.
//   loading:  the rank table is out: the ranks load, and the node reports ready once they serve.
//   serving:  every node was ready once. Nothing the network does fails the node now: losing
//             node 0 is PEER_LOST 0, and it is dialled again at the capped retry pace (retrying,
//             connecting, rejoining) until whatever coordinator answers there takes it back
//             (inGroup); a restarted node 0 forms the group again, and this node reports ready at once.
//   failed:   GROUP_FAILED; closed: the node stopped or failed itself.
//
// It holds no connection: src/rendezvous/groupMember.ts owns the socket to node 0, turns what
// node 0 says into events, and provides the actions below that connect, write and close.
import { assertEvent, assign, setup, stateIn } from 'xstate';
import { receivedCode, RendezvousError, serializeError, WeightdError, type SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import { timeoutRejection } from '../rendezvous/checkJoin.js';
import type { GroupEvent, ModelGroupJoin } from '../rendezvous/groupEvents.js';
import type { NodeContent } from '../rendezvous/nodeContent.js';
import type { RankTableEntry } from '../wire/rankTable.js';
import type { GroupTiming } from '../rendezvous/timing.js';
import type { ClientMessage, ServerMessage } from '../rendezvous/groupMessages.js';

export interface GroupMemberInput {
  /** Node 0's --master-addr and --weight-cache-master-port. */
  host: string;
  port: number;
  nnodes: number;
  localWorldSize: number;
  rendezvousTimeoutMs: number;
  timing: GroupTiming;
  /** performance.now() when the member started: the rendezvous deadline counts from then. */
  startedAt: number;
  log: Logger;
  /** To the supervisor (through src/actors/groupSession.ts). */
  emit: (event: GroupEvent) => void;
}

export interface GroupMemberContext extends GroupMemberInput {
  /** The next retry's pace (doubled each time, up to timing.retryMaxMs; back to the minimum once node 0 says hello). */
  retryDelayMs: number;
  /** The retry scheduled now, jittered. */
  retryInMs: number;
  lastAttemptError: string;
  /** Who had joined, as node 0 last said while this node waited. */
  joined: number[];
  /** Nodes reported lost (PEER_LOST sent, no PEER_BACK yet), with why. */
  lost: Array<{ nodeRank: number; reason: string }>;
  /** The last refusal of a rejoin, logged once until it changes. */
  lastRefusal?: string;
  /** Model groups this node joined that have no verdict yet: name -> fingerprint. */
  models: Record<string, string>;
  /** Set once every local rank serves, holding `content` (compared across nodes at the barrier). */
  ready?: { content?: NodeContent };
  failure?: SerializedError;
}

type Verdict = Extract<ServerMessage, { type: 'model_commit' | 'model_abort' }>;
type Rejection = { code: string; message: string; details?: Record<string, unknown> };

export type GroupMemberEvent =
  // What node 0 says on the current connection (groupMessages.ts' server messages).
  | { type: 'HELLO' }
  | { type: 'WAITING'; joined: number[]; missing: number[] }
  | { type: 'JOINED'; rankTable: RankTableEntry[] }
  | { type: 'GROUP_READY'; lost: number[] }
  | { type: 'PEER_LOST'; nodeRank: number; reason: string }
  | { type: 'PEER_BACK'; nodeRank: number }
  | { type: 'REJECTED'; rejection: Rejection }
  | { type: 'LEAVING'; reason: string }
  | { type: 'MODEL_WAITING'; name: string; fingerprint: string; joined: number[]; missing: number[] }
  | { type: 'MODEL_VERDICT'; verdict: Verdict }
  | { type: 'MODEL_RELOAD'; name: string; fingerprint: string; nodeRank: number }
  /** The current connection closed; protocolError: what the peer sent was not the rendezvous protocol. */
  | { type: 'LINK_CLOSED'; reason: string; protocolError?: string }
  // What this node says (src/actors/groupSession.ts).
  | { type: 'NODE_READY'; content?: NodeContent }
  | { type: 'NODE_FAILED'; error: SerializedError }
  | { type: 'MODEL_JOIN'; join: ModelGroupJoin }
  | { type: 'MODEL_RESIDENT'; name: string; fingerprint: string }
  | { type: 'MODEL_FAILED'; name: string; fingerprint?: string; error: SerializedError }
  | { type: 'MODEL_STALE'; name: string; fingerprint: string }
  | { type: 'CLOSE' };

type Args = { context: GroupMemberContext; event: GroupMemberEvent };

const where = (c: GroupMemberContext) => `${c.host}:${c.port}`;
const deadlineLeft = (c: GroupMemberContext) => c.startedAt + c.rendezvousTimeoutMs - performance.now();
const plural = (missing: number[]) => `node rank${missing.length === 1 ? '' : 's'} ${missing.join(', ')}`;

/** The failures a starting group ends with, as `recordFailure`'s params. */
const failure = {
  rejected: ({ event }: Args) => {
    assertEvent(event, 'REJECTED');
    const r = event.rejection;
    return new RendezvousError(receivedCode(r.code), r.message, r.details ?? {});
  },
  notWeightd: ({ context, event }: Args) => {
    assertEvent(event, 'LINK_CLOSED');
    return new RendezvousError(
      'E_RDZV_NOT_WEIGHTD',
      `${where(context)} does not speak the weightd rendezvous protocol (${event.protocolError}); something else listens there: ` +
        "check --master-addr (node 0's address) and --weight-cache-master-port (the same on every node, not the engine's --master-port)",
      { host: context.host, port: context.port },
    );
  },
  coordinatorLost: ({ context, event }: Args) => {
    assertEvent(event, 'LINK_CLOSED');
    return new RendezvousError(
      'E_RDZV_COORDINATOR_LOST',
      `lost the connection to node 0 at ${where(context)} before the group was ready (${event.reason}); start-up is all-or-nothing, ` +
        "so every node fails: see node 0's log for why, then restart every node",
      { host: context.host, port: context.port, reason: event.reason },
    );
  },
  /** Connected, but the group never completed: which nodes are missing (node 0 hears it too: waitedInVain). */
  waitedInVain: ({ context }: Args) => {
    const r = timeoutRejection(context.rendezvousTimeoutMs, context.nnodes, context.joined);
    return new RendezvousError(r.code, r.message, r.details);
  },
  unanswered: ({ context }: Args) =>
    new RendezvousError(
      'E_RDZV_TIMEOUT',
      `rendezvous timed out after ${context.rendezvousTimeoutMs / 1000} s: node 0 at ${where(context)} never answered (last attempt: ${context.lastAttemptError}); ` +
        `start node 0 with --node-rank 0 --master-addr ${context.host} --weight-cache-master-port ${context.port}, check that this node can reach it ` +
        '(routes, firewall), or raise --rendezvous-timeout',
      { field: 'nodeRank', missing: [0], host: context.host, port: context.port },
    ),
};

/** The messages the transitions below write to node 0, as `send`'s params. */
const says = {
  ready: ({ context }: Args): ClientMessage => ({ type: 'ready', ...(context.ready?.content ? { content: context.ready.content } : {}) }),
  failed: ({ event }: Args): ClientMessage => {
    assertEvent(event, 'NODE_FAILED');
    return { type: 'failed', code: event.error.code, message: event.error.message.slice(0, 2000) };
  },
  timedOut: ({ context }: Args): ClientMessage => {
    const r = timeoutRejection(context.rendezvousTimeoutMs, context.nnodes, context.joined);
    return { type: 'failed', code: r.code, message: r.message };
  },
  modelJoin: ({ event }: Args): ClientMessage => {
    assertEvent(event, 'MODEL_JOIN');
    return { type: 'model_join', ...event.join };
  },
  modelResident: ({ event }: Args): ClientMessage => {
    assertEvent(event, 'MODEL_RESIDENT');
    return { type: 'model_resident', name: event.name, fingerprint: event.fingerprint };
  },
  modelStale: ({ event }: Args): ClientMessage => {
    assertEvent(event, 'MODEL_STALE');
    return { type: 'model_stale', name: event.name, fingerprint: event.fingerprint };
  },
  modelFailed: ({ event }: Args): ClientMessage => {
    assertEvent(event, 'MODEL_FAILED');
    return { type: 'model_failed', name: event.name, fingerprint: event.fingerprint, code: event.error.code, message: event.error.message.slice(0, 2000) };
  },
};

function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the group member's "${name}" action was not provided; create the machine with .provide({ actions }) (src/rendezvous/groupMember.ts does)`);
}

const modelAbort = (
  context: GroupMemberContext,
  name: string,
  fingerprint: string,
  code: 'E_MODEL_GROUP_COORDINATOR_LOST' | 'E_MODEL_GROUP_MISMATCH',
  message: string,
  details: Record<string, unknown> = { host: context.host, port: context.port },
): GroupEvent => ({
  type: 'MODEL_GROUP_ABORT',
  name,
  fingerprint,
  error: serializeError(new RendezvousError(code, message, details)),
});

const groupMemberSetup = setup({
  types: {
    context: {} as GroupMemberContext,
    events: {} as GroupMemberEvent,
    input: {} as GroupMemberInput,
  },
  delays: {
    rendezvousDeadline: ({ context }) => Math.max(0, deadlineLeft(context)),
    handshake: ({ context }) => context.timing.handshakeMs,
    retry: ({ context }) => context.retryInMs,
  },
  guards: {
    notWeightd: ({ event }) => event.type === 'LINK_CLOSED' && event.protocolError !== undefined,
    pastDeadline: ({ context }) => deadlineLeft(context) <= 0,
    waitingForOthers: stateIn({ starting: 'waiting' }),
    locallyReady: ({ context }) => context.ready !== undefined,
    modelPending: ({ context, event }) => {
      assertEvent(event, 'MODEL_JOIN');
      return context.models[event.join.name] !== undefined;
    },
    sameModelPending: ({ context, event }) => {
      assertEvent(event, 'MODEL_JOIN');
      return context.models[event.join.name] === event.join.fingerprint;
    },
    // A model group is joined only on a connection that has the rank table, with node 0 not lost.
    inGroup: ({ context }) => !context.lost.some((l) => l.nodeRank === 0),
    ownsModel: ({ context, event }) => {
      assertEvent(event, ['MODEL_RESIDENT', 'MODEL_VERDICT']);
      const { name, fingerprint } = event.type === 'MODEL_VERDICT' ? event.verdict : event;
      return context.models[name] === fingerprint;
    },
  },
  actions: {
    // What the connection side does (src/rendezvous/groupMember.ts provides them).
    /** Dials node 0: a new connection, whose messages and close come back as events. */
    connect: () => notProvided('connect'),
    send: (_, _m: ClientMessage) => notProvided('send'),
    /** The join, with the token's proof of node 0's nonce. */
    sendJoin: () => notProvided('sendJoin'),
    /** Closes the connection; LINK_CLOSED follows. */
    closeLink: (_, _p: { reason: string }) => notProvided('closeLink'),
    /** Cuts the connection at once (protocolError: as a protocol violation); LINK_CLOSED follows. */
    destroyLink: (_, _p: { reason: string; protocolError?: string }) => notProvided('destroyLink'),
    /** Says `leaving` to node 0 and lets the connection go: nothing it says is heard any more. */
    leave: (_, _p: { reason: string }) => notProvided('leave'),

    resetRetryDelay: assign({ retryDelayMs: ({ context }) => context.timing.retryMinMs }),
    planRetry: assign(({ context }, { beforeDeadline }: { beforeDeadline: boolean }) => {
      const delay = beforeDeadline ? Math.max(0, Math.min(context.retryDelayMs, deadlineLeft(context))) : context.retryDelayMs;
      // Jitter, so nodes that lost node 0 together do not all dial it in the same millisecond.
      return { retryDelayMs: Math.min(context.retryDelayMs * 2, context.timing.retryMaxMs), retryInMs: Math.round(delay * (0.75 + Math.random() * 0.25)) };
    }),
    logRetry: ({ context }) => context.log.debug({ delayMs: context.retryInMs, lastError: context.lastAttemptError }, 'node 0 not reachable yet; retrying'),
    recordAttempt: assign({
      lastAttemptError: ({ event }) => {
        assertEvent(event, 'LINK_CLOSED');
        return event.reason;
      },
    }),
    recordWaiting: assign({
      joined: ({ context, event }) => {
        assertEvent(event, 'WAITING');
        context.log.info({ joined: event.joined, missing: event.missing }, `joined the group at ${where(context)}; waiting for ${plural(event.missing)}`);
        context.emit({ type: 'GROUP_WAITING', joined: event.joined, missing: event.missing });
        return event.joined;
      },
    }),
    announceJoined: ({ context, event }) => {
      assertEvent(event, 'JOINED');
      context.log.info({ rankTable: event.rankTable }, `every node joined: global rank table (global = node_rank * ${context.localWorldSize} + local_rank)`);
      context.emit({ type: 'GROUP_JOINED', rankTable: event.rankTable });
    },
    logRejoined: ({ context, event }) => {
      assertEvent(event, 'JOINED');
      context.log.info({ rankTable: event.rankTable }, `rejoined the group at ${where(context)}; still serving, reporting ready`);
    },
    recordReady: assign({
      ready: ({ event }) => {
        assertEvent(event, 'NODE_READY');
        return { content: event.content };
      },
    }),
    announceGroupReady: ({ context }) => {
      context.log.info({ nnodes: context.nnodes }, 'group ready: every node is serving');
      context.emit({ type: 'GROUP_READY' });
    },
    clearRefusal: assign({ lastRefusal: undefined }),
    /** The peers an event makes lost or back (peerChanges), each logged and told to the supervisor once. */
    reportPeers: ({ context, event }, p: { first: boolean }) => {
      for (const c of peerChanges(context, event, p.first)) {
        if (c.reason !== undefined) {
          context.log.warn({ peer: c.nodeRank, reason: c.reason }, `node ${c.nodeRank} lost; this node keeps serving`);
          context.emit({ type: 'PEER_LOST', nodeRank: c.nodeRank, reason: c.reason });
        } else {
          context.log.info({ peer: c.nodeRank }, `node ${c.nodeRank} is back and serving`);
          context.emit({ type: 'PEER_BACK', nodeRank: c.nodeRank });
        }
      }
    },
    recordPeers: assign({
      lost: ({ context, event }, p: { first: boolean }) =>
        peerChanges(context, event, p.first).reduce<Lost>((lost, c) => (c.reason !== undefined ? [...lost, { nodeRank: c.nodeRank, reason: c.reason }] : lost.filter((l) => l.nodeRank !== c.nodeRank)), context.lost),
    }),
    // Already serving: a refused rejoin (node 0 restarted with another checkpoint, or still
    // holding our old connection) changes nothing here. Keep trying at the slow pace.
    recordRefusal: assign(({ context, event }) => {
      assertEvent(event, 'REJECTED');
      const { code, message } = event.rejection;
      if (message !== context.lastRefusal) context.log.warn({ code }, `node 0 refused this node's rejoin (retrying): ${message}`);
      return { lastRefusal: message, retryDelayMs: context.timing.retryMaxMs };
    }),
    // A verdict can no longer reach this node: what it loads across the group is freed here.
    abortModels: ({ context, event }) => {
      assertEvent(event, 'LINK_CLOSED');
      for (const [name, fingerprint] of Object.entries(context.models)) {
        const message = `model "${name}": the connection to node 0 at ${where(context)} was lost during its load (${event.reason}); it was not served, the older version serves on`;
        context.emit(modelAbort(context, name, fingerprint, 'E_MODEL_GROUP_COORDINATOR_LOST', message));
      }
    },
    forgetModels: assign({ models: {} }),
    logReconnecting: ({ context }) => {
      if (!context.lost.some((l) => l.nodeRank === 0)) context.log.info(`reconnecting to node 0 at ${where(context)} in the background`);
    },
    recordFailure: assign({ failure: (_, error: RendezvousError) => serializeError(error) }),
    announceFailure: ({ context }) => context.emit({ type: 'GROUP_FAILED', error: context.failure! }),
    recordModel: assign({
      models: ({ context, event }) => {
        assertEvent(event, 'MODEL_JOIN');
        return { ...context.models, [event.join.name]: event.join.fingerprint };
      },
    }),
    logDuplicateJoin: ({ context, event }) => {
      assertEvent(event, 'MODEL_JOIN');
      context.log.debug({ model: event.join.name, fingerprint: event.join.fingerprint }, `model "${event.join.name}": this version has joined its group already`);
    },
    // The version pending keeps its place in the group (its verdict is still to come); only the
    // other version is refused.
    refuseOtherVersion: ({ context, event }) => {
      assertEvent(event, 'MODEL_JOIN');
      const { name, fingerprint } = event.join;
      const pending = context.models[name]!;
      const message =
        `model "${name}": this node is loading version ${pending.slice(0, 12)}… of it across the group, so version ${fingerprint.slice(0, 12)}… was refused; ` +
        'load it once that one serves or fails (weightd ctl list shows it)';
      context.emit(modelAbort(context, name, fingerprint, 'E_MODEL_GROUP_MISMATCH', message, { field: 'fingerprint', value: fingerprint, expected: pending }));
    },
    abortModelJoin: ({ context, event }, { serving }: { serving: boolean }) => {
      assertEvent(event, 'MODEL_JOIN');
      const { name, fingerprint } = event.join;
      const message =
        `model "${name}" spans the group, but node 0 at ${where(context)} is not reachable now (${serving ? 'reconnecting' : 'the group is not ready'}); ` +
        'a swap across nodes needs every node and node 0: try again once node 0 serves';
      context.emit(modelAbort(context, name, fingerprint, 'E_MODEL_GROUP_COORDINATOR_LOST', message));
    },
    forgetModel: assign({
      models: ({ context, event }) => {
        assertEvent(event, ['MODEL_FAILED', 'MODEL_VERDICT']);
        const { name, fingerprint } = event.type === 'MODEL_VERDICT' ? event.verdict : event;
        return fingerprint !== undefined && context.models[name] === fingerprint ? withoutModel(context.models, name) : context.models;
      },
    }),
    logModelWaiting: ({ context, event }) => {
      assertEvent(event, 'MODEL_WAITING');
      if (context.models[event.name] !== event.fingerprint) return;
      context.log.info({ model: event.name, joined: event.joined, missing: event.missing }, `model "${event.name}": waiting for ${plural(event.missing)} to load it too`);
    },
    logStaleUntold: ({ context, event }) => {
      assertEvent(event, 'MODEL_STALE');
      context.log.error(
        { model: event.name, fingerprint: event.fingerprint },
        `model "${event.name}" went stale here, but node 0 at ${where(context)} is not reachable now: the group does not load it again; load it with weightd ctl load on every node once node 0 serves`,
      );
    },
    announceReload: ({ context, event }) => {
      assertEvent(event, 'MODEL_RELOAD');
      context.emit({ type: 'MODEL_GROUP_RELOAD', name: event.name, fingerprint: event.fingerprint, nodeRank: event.nodeRank });
    },
    announceVerdict: ({ context, event }) => {
      assertEvent(event, 'MODEL_VERDICT');
      const v = event.verdict;
      if (v.type === 'model_commit') {
        context.log.info({ model: v.name, fingerprint: v.fingerprint }, `model "${v.name}" is resident on every node: serving it`);
        context.emit({ type: 'MODEL_GROUP_COMMIT', name: v.name, fingerprint: v.fingerprint });
      } else {
        context.emit({ type: 'MODEL_GROUP_ABORT', name: v.name, fingerprint: v.fingerprint, error: serializeError(new RendezvousError(receivedCode(v.code), v.message, v.details ?? {})) });
      }
    },
  },
});

type Lost = GroupMemberContext['lost'];
/** A node lost (with why) or back (no reason). */
type PeerChange = { nodeRank: number; reason?: string };

/**
 * What an event changes in the set of lost nodes, each node once: node 0's word on the group
 * (`first`: the group just became ready, else it is back after losing node 0, and node 0's set
 * replaces ours), a peer lost or back, or the connection to node 0 lost while serving.
 */
function peerChanges(context: GroupMemberContext, event: GroupMemberEvent, first: boolean): PeerChange[] {
  let lost = context.lost.map((l) => l.nodeRank);
  const changes: PeerChange[] = [];
  const lose = (nodeRank: number, reason: string) => {
    if (lost.includes(nodeRank)) return;
    lost = [...lost, nodeRank];
    changes.push({ nodeRank, reason });
  };
  const back = (nodeRank: number) => {
    if (!lost.includes(nodeRank)) return;
    lost = lost.filter((r) => r !== nodeRank);
    changes.push({ nodeRank });
  };
  assertEvent(event, ['GROUP_READY', 'PEER_LOST', 'PEER_BACK', 'LINK_CLOSED']);
  if (event.type === 'GROUP_READY') {
    if (!first) for (const r of context.lost.map((l) => l.nodeRank)) if (!event.lost.includes(r)) back(r);
    for (const r of event.lost) lose(r, first ? 'lost before this node joined' : 'lost while this node was cut off from node 0');
  } else if (event.type === 'PEER_LOST') lose(event.nodeRank, event.reason);
  else if (event.type === 'PEER_BACK') back(event.nodeRank);
  else lose(0, `connection to node 0 lost (${event.reason})`);
  return changes;
}

const withoutModel = (models: Record<string, string>, name: string) => Object.fromEntries(Object.entries(models).filter(([n]) => n !== name));

const fail = <P extends (args: Args) => RendezvousError>(params: P) => ({ target: '#groupMember.failed', actions: { type: 'recordFailure', params } }) as const;
const secondHello = { actions: { type: 'destroyLink', params: { reason: 'protocol error: a second hello', protocolError: 'a second hello' } } } as const;
const leaving = {
  actions: {
    type: 'closeLink',
    params: ({ event }: Args) => {
      assertEvent(event, 'LEAVING');
      return { reason: `node 0 said: ${event.reason}` };
    },
  },
} as const;
/** The rank table is out: the ranks load (and a node already ready says so at once, as the original did on every table). */
const joinedGroup = [
  { guard: 'locallyReady', target: '#groupMember.loading', actions: ['announceJoined', { type: 'send', params: says.ready }] },
  { target: '#groupMember.loading', actions: 'announceJoined' },
] as const;
const peerActions = [{ type: 'reportPeers', params: { first: false } }, { type: 'recordPeers', params: { first: false } }] as const;
/** Serving, the connection to node 0 went: node 0 is lost until a coordinator there takes this node back. */
const node0Lost = { target: 'retrying', actions: ['abortModels', 'forgetModels', { type: 'reportPeers', params: { first: false } }, 'logReconnecting', { type: 'recordPeers', params: { first: false } }] } as const;
/**
 * A join of a name whose version is pending here: the same version again changes nothing (node 0
 * counts this node once), another one is refused; neither forgets the pending one.
 */
const pendingJoin = [
  { guard: 'sameModelPending', actions: 'logDuplicateJoin' },
  { guard: 'modelPending', actions: 'refuseOtherVersion' },
] as const;
const noHello = ({ context }: Args) => ({ reason: `no hello within ${context.timing.handshakeMs} ms` });
/** node.failed: node 0 hears it (best effort) once it said hello on this connection, so a starting group fails everywhere now. */
const nodeFailedLinked = { target: '#groupMember.closed', actions: [{ type: 'send', params: says.failed }, { type: 'leave', params: { reason: 'node failed' } }] } as const;

export const groupMemberMachine = groupMemberSetup.createMachine({
  id: 'groupMember',
  initial: 'starting',
  context: ({ input }) => ({ ...input, retryDelayMs: input.timing.retryMinMs, retryInMs: 0, lastAttemptError: 'no attempt yet', joined: [], lost: [], models: {} }),
  states: {
    starting: {
      initial: 'connecting',
      after: {
        rendezvousDeadline: [
          // Tell node 0 why this node gives up, so the others fail with the same reason now.
          { guard: 'waitingForOthers', target: 'failed', actions: [{ type: 'send', params: says.timedOut }, { type: 'recordFailure', params: failure.waitedInVain }] },
          fail(failure.unanswered),
        ],
      },
      on: { REJECTED: fail(failure.rejected) },
      states: {
        connecting: {
          entry: 'connect',
          // Something that accepts connections but never says hello is not a coordinator yet.
          after: { handshake: { actions: { type: 'destroyLink', params: noHello } } },
          on: {
            HELLO: { target: 'joining', actions: ['resetRetryDelay', 'sendJoin'] },
            LINK_CLOSED: [{ guard: 'notWeightd', target: '#groupMember.failed', actions: ['recordAttempt', { type: 'recordFailure', params: failure.notWeightd }] }, { target: 'retrying', actions: 'recordAttempt' }],
          },
        },
        joining: {
          on: {
            WAITING: { target: 'waiting', actions: 'recordWaiting' },
            JOINED: joinedGroup,
            // Not accepted yet: node 0 may just be restarting; the join is retried within the deadline.
            LINK_CLOSED: 'retrying',
            NODE_FAILED: nodeFailedLinked,
          },
        },
        waiting: {
          on: {
            WAITING: { actions: 'recordWaiting' },
            JOINED: joinedGroup,
            LINK_CLOSED: fail(failure.coordinatorLost),
            NODE_FAILED: nodeFailedLinked,
          },
        },
        retrying: {
          entry: [{ type: 'planRetry', params: { beforeDeadline: true } }, 'logRetry'],
          always: { guard: 'pastDeadline', ...fail(failure.unanswered) },
          after: { retry: 'connecting' },
        },
      },
    },
    // The ready barrier: the ranks load, and this node says ready once they serve.
    loading: {
      on: {
        NODE_READY: { actions: ['recordReady', { type: 'send', params: says.ready }] },
        GROUP_READY: {
          target: 'serving',
          actions: ['clearRefusal', 'announceGroupReady', { type: 'reportPeers', params: { first: true } }, { type: 'recordPeers', params: { first: true } }],
        },
        REJECTED: fail(failure.rejected),
        LINK_CLOSED: fail(failure.coordinatorLost),
        NODE_FAILED: nodeFailedLinked,
      },
    },
    serving: {
      initial: 'inGroup',
      states: {
        inGroup: {
          on: {
            NODE_READY: { actions: ['recordReady', { type: 'send', params: says.ready }] },
            MODEL_JOIN: [
              ...pendingJoin,
              { guard: 'inGroup', actions: ['recordModel', { type: 'send', params: says.modelJoin }] },
              { actions: { type: 'abortModelJoin', params: { serving: true } } },
            ],
            MODEL_STALE: [{ guard: 'inGroup', actions: { type: 'send', params: says.modelStale } }, { actions: 'logStaleUntold' }],
            LINK_CLOSED: node0Lost,
            NODE_FAILED: nodeFailedLinked,
          },
        },
        retrying: {
          entry: [{ type: 'planRetry', params: { beforeDeadline: false } }, 'logRetry'],
          after: { retry: 'connecting' },
        },
        connecting: {
          entry: 'connect',
          after: { handshake: { actions: { type: 'destroyLink', params: noHello } } },
          on: {
            HELLO: { target: 'rejoining', actions: ['resetRetryDelay', 'sendJoin'] },
            LINK_CLOSED: { target: 'retrying', actions: 'recordAttempt' },
          },
        },
        rejoining: {
          on: {
            WAITING: { actions: 'recordWaiting' },
            JOINED: [
              { guard: 'locallyReady', target: 'inGroup', actions: ['logRejoined', { type: 'send', params: says.ready }] },
              { target: 'inGroup', actions: 'logRejoined' },
            ],
            LINK_CLOSED: node0Lost,
            NODE_FAILED: nodeFailedLinked,
          },
        },
      },
      on: {
        // Back in a group after losing node 0: the lost set follows the coordinator's.
        GROUP_READY: { actions: ['clearRefusal', { type: 'reportPeers', params: { first: false } }, { type: 'recordPeers', params: { first: false } }] },
        PEER_LOST: { actions: peerActions },
        PEER_BACK: { actions: peerActions },
        REJECTED: {
          actions: [
            'recordRefusal',
            { type: 'closeLink', params: ({ event }) => (assertEvent(event, 'REJECTED'), { reason: `rejoin refused: ${event.rejection.code}` }) },
          ],
        },
        MODEL_FAILED: { actions: ['forgetModel', { type: 'send', params: says.modelFailed }] },
      },
    },
    failed: { type: 'final', entry: [{ type: 'leave', params: { reason: 'group failed' } }, 'announceFailure'] },
    closed: { type: 'final' },
  },
  on: {
    // A second hello on one connection (each connecting state takes the first).
    HELLO: secondHello,
    LEAVING: leaving,
    NODE_READY: { actions: 'recordReady' },
    NODE_FAILED: { target: '.closed', actions: { type: 'leave', params: { reason: 'node failed' } } },
    CLOSE: { target: '.closed', actions: { type: 'leave', params: { reason: 'node stopped' } } },
    MODEL_JOIN: [
      ...pendingJoin,
      { guard: stateIn('serving'), actions: { type: 'abortModelJoin', params: { serving: true } } },
      { actions: { type: 'abortModelJoin', params: { serving: false } } },
    ],
    MODEL_RESIDENT: { guard: 'ownsModel', actions: { type: 'send', params: says.modelResident } },
    MODEL_FAILED: { actions: 'forgetModel' },
    MODEL_WAITING: { actions: 'logModelWaiting' },
    MODEL_VERDICT: { guard: 'ownsModel', actions: ['forgetModel', 'announceVerdict'] },
    MODEL_STALE: { actions: 'logStaleUntold' },
    MODEL_RELOAD: { actions: 'announceReload' },
  },
});

/** The member's phase: its top-level state. */
export type GroupMemberPhase = 'starting' | 'loading' | 'serving' | 'failed' | 'closed';
