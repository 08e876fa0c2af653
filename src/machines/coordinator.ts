// The rendezvous coordinator's phases as a state machine: gathering (joins are checked as they
// come; a broken rule or the rendezvous deadline fails the group) -> loading (the rank table is
// out: the ready barrier; any node failing or vanishing fails the group) -> serving (everyone
// was ready once; a lost node is only reported, and the same node rank may rejoin). A failed
// group keeps answering joins with its verdict until every node has heard it, so a node that
// starts late learns the real cause instead of timing out.
//
// It holds the group (members, rank table, verdict) and no connection: src/rendezvous/
// coordinator.ts owns the sockets, turns what they say into events, and provides the actions
// below that write to them. Links are named by the number that class gives each connection.
import { and, assertEvent, assign, raise, setup } from 'xstate';
import { WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import type { LogLimiter } from '../wire/logLimiter.js';
import { checkJoin, describeNode, rejectVersion, timeoutRejection, tokenAccepted, type GroupExpectation, type NodeIdentity, type Rejection } from '../rendezvous/checkJoin.js';
import { contentDifference, type NodeContent } from '../rendezvous/nodeContent.js';
import { groupRankTable, type RankTableEntry } from '../wire/rankTable.js';
import type { JoinMessage, ServerMessage } from '../rendezvous/groupMessages.js';

export interface CoordinatorInput {
  expect: GroupExpectation;
  rendezvousTimeoutMs: number;
  /** performance.now() when the coordinator started listening: the deadline counts from then. */
  startedAt: number;
  log: Logger;
  /** For the lines strangers can cause (turned-away joins): bounded, so they cannot flood the log. */
  strangerLog: LogLimiter;
}

/** What node 0 knows of one member of its group (the member itself runs a GroupMember). */
export interface MemberRecord extends NodeIdentity {
  linkId: number;
  /** joined: accepted; ready: reported ready; lost: its connection is gone (or it failed while serving). */
  state: 'joined' | 'ready' | 'lost';
  /** What it reported holding at the ready barrier (absent: a node without digests). */
  content?: NodeContent;
}

/** A connection that claimed a node rank with a valid token: it hears a failed group's verdict. */
export interface Claim {
  linkId: number;
  /** -1: a join of another protocol version that named no rank. */
  nodeRank: number;
}

export interface CoordinatorContext extends CoordinatorInput {
  claims: Claim[];
  members: MemberRecord[];
  rankTable: RankTableEntry[];
  verdict?: Rejection;
  /** The first distinct joins turned away (at most MAX_TURNED_AWAY_NAMED), named in the timeout verdict. */
  turnedAway: string[];
  /** Every join turned away, named or not. */
  turnedAwayCount: number;
  /** Node ranks whose connection was sent the verdict. */
  told: number[];
  /** Claims whose verdict is being written. */
  telling: Claim[];
}

export type CoordinatorEvent =
  | { type: 'JOIN'; linkId: number; address: string; nonce: string; join: JoinMessage }
  /** A join of another protocol version: only the fields every version keeps could be read. */
  | { type: 'FOREIGN_JOIN'; linkId: number; address: string; version: number; nodeRank?: number; hostName?: string }
  /** A node that failed before it could join. */
  | { type: 'ABORT'; linkId: number; address: string; nonce: string; tokenProof: string | null; nodeRank: number; hostName: string; code: string; message: string }
  | { type: 'READY'; linkId: number; content?: NodeContent }
  /** A connection's "failed" message; it counts only from a member. */
  | { type: 'LINK_FAILED'; linkId: number; code: string; message: string }
  /** A member failed (node 0 reports its own failure directly). */
  | { type: 'NODE_FAILED'; nodeRank: number; code: string; message: string }
  | { type: 'LINK_CLOSED'; linkId: number; reason: string }
  | { type: 'VERDICT_SENT'; linkId: number; nodeRank: number }
  | { type: 'CLOSE' };

type JoinEvent = Extract<CoordinatorEvent, { type: 'JOIN' | 'FOREIGN_JOIN' }>;

const liveMember = (c: CoordinatorContext, linkId: number) => c.members.find((m) => m.linkId === linkId && m.state !== 'lost');
const memberByRank = (c: CoordinatorContext, nodeRank: number) => c.members.find((m) => m.nodeRank === nodeRank);
const claimedRank = (e: JoinEvent) => (e.type === 'JOIN' ? e.join.nodeRank : e.nodeRank ?? -1);
const allRanks = (c: CoordinatorContext) => Array.from({ length: c.expect.nnodes }, (_, r) => r);
/** To every node in the group that is still connected, but `except`. */
const connected = (c: CoordinatorContext, except?: number) => c.members.filter((m) => m.state !== 'lost' && m.linkId !== except).map((m) => m.linkId);

/** While serving, the same node rank may come back once its old connection is known lost. */
function lostPredecessor(c: CoordinatorContext, e: JoinEvent): MemberRecord | undefined {
  const previous = memberByRank(c, claimedRank(e));
  return previous?.state === 'lost' ? previous : undefined;
}

/** The first rule `e` breaks, checked against the other members (a lost predecessor is not one). */
function joinRejection(c: CoordinatorContext, e: JoinEvent, serving: boolean): Rejection | undefined {
  if (e.type === 'FOREIGN_JOIN') return rejectVersion({ nodeRank: e.nodeRank, hostName: e.hostName, address: e.address }, e.version);
  const previous = serving ? lostPredecessor(c, e) : undefined;
  return checkJoin(e.join, e.address, c.expect, e.nonce, c.members.filter((m) => m !== previous));
}

function memberOf(e: Extract<CoordinatorEvent, { type: 'JOIN' }>): MemberRecord {
  const j = e.join;
  return { nodeRank: j.nodeRank, hostName: j.hostName, address: e.address, deviceUuids: j.deviceUuids, linkId: e.linkId, state: 'joined' };
}

type Args = { context: CoordinatorContext; event: CoordinatorEvent };

/** The messages and verdicts the transitions below hand to the I/O actions, as `params`. */
const to = {
  waiting: ({ context }: Args) => {
    const joined = context.members.map((m) => m.nodeRank).sort((a, b) => a - b);
    return { linkIds: connected(context), message: { type: 'waiting', joined, missing: allRanks(context).filter((r) => !joined.includes(r)) } as const };
  },
  rankTable: ({ context }: Args) => ({ linkIds: connected(context), message: { type: 'joined', rankTable: context.rankTable } as const }),
  groupReady: ({ context }: Args) => ({ linkIds: connected(context), message: { type: 'group_ready', lost: [] as number[] } as const }),
  rejoinerTable: ({ context, event }: Args) => {
    assertEvent(event, 'JOIN');
    return { linkIds: [event.linkId], message: { type: 'joined', rankTable: context.rankTable } as const };
  },
  rejoinerReady: ({ context, event }: Args) => {
    assertEvent(event, 'READY');
    return { linkIds: [event.linkId], message: { type: 'group_ready', lost: context.members.filter((m) => m.state === 'lost').map((m) => m.nodeRank) } as const };
  },
  peerBack: ({ context, event }: Args) => {
    assertEvent(event, 'READY');
    return { linkIds: connected(context, event.linkId), message: { type: 'peer_back', nodeRank: liveMember(context, event.linkId)!.nodeRank } as const };
  },
  /** After `markLostMember`: every other connected member hears who and why. */
  peerLost: ({ context, event }: Args) => {
    const { member, reason } = lostMember(context, event);
    return { linkIds: connected(context, member.linkId), message: { type: 'peer_lost', nodeRank: member.nodeRank, reason } as const };
  },
  failedNode: ({ context, event }: Args) => {
    assertEvent(event, 'NODE_FAILED');
    return { linkId: memberByRank(context, event.nodeRank)!.linkId, reason: 'node failed' };
  },
  abortNoted: ({ event }: Args) => {
    assertEvent(event, 'ABORT');
    return { linkId: event.linkId, reason: 'noted' };
  },
  refusal: ({ context, event }: Args) => {
    assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
    return { linkId: event.linkId, rejection: joinRejection(context, event, true)! };
  },
  turnedAway: ({ context, event }: Args) => {
    assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
    return { linkId: event.linkId, rejection: admissionRefusal(context, event) };
  },
  abortRefused: ({ event }: Args) => {
    assertEvent(event, 'ABORT');
    return { linkId: event.linkId, reason: 'rejected: E_RDZV_TOKEN' };
  },
  claims: ({ context }: Args) => ({ claims: context.claims, verdict: context.verdict! }),
  latecomer: ({ context, event }: Args) => {
    assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
    return { claims: [{ linkId: event.linkId, nodeRank: claimedRank(event) }], verdict: context.verdict! };
  },
  secondJoin: ({ context, event }: Args) => {
    assertEvent(event, 'JOIN');
    return { linkId: event.linkId, what: 'a second join on one connection', peer: context.claims.find((c) => c.linkId === event.linkId)?.nodeRank };
  },
  stranger: ({ event }: Args) => {
    assertEvent(event, ['READY', 'LINK_FAILED']);
    return { linkId: event.linkId, what: `"${event.type === 'READY' ? 'ready' : 'failed'}" before an accepted join` };
  },
  earlyReady: ({ context, event }: Args) => {
    assertEvent(event, 'READY');
    return { linkId: event.linkId, what: '"ready" before the rank table', peer: liveMember(context, event.linkId)?.nodeRank };
  },
};

/**
 * The nodes (with the READY being handled counted in) whose reported content differs from node
 * 0's, as a verdict naming each and its tensors; undefined when all agree. Node 0 is the
 * reference: with two nodes nothing says which copy is the damaged one, and node 0's is the one
 * the operator started the group from.
 */
function contentVerdict(context: CoordinatorContext, event: Extract<CoordinatorEvent, { type: 'READY' }>): Rejection | undefined {
  const members = context.members.map((m) => (m.linkId === event.linkId ? { ...m, content: event.content } : m));
  const reference = members.find((m) => m.nodeRank === 0)?.content;
  if (!reference) return undefined;
  const names = context.expect.tensorNames ?? [];
  const differing = members.flatMap((m) => {
    const tensors = m.content && m.nodeRank !== 0 ? contentDifference(names, reference, m.content) : undefined;
    return tensors ? [{ node: m, tensors }] : [];
  });
  if (differing.length === 0) return undefined;
  const listed = 5;
  const what = differing.map(({ node, tensors }) =>
    `${describeNode(node)} holds other bytes than node 0 in ${tensors.length === 0 ? 'a tensor (not identified: only the fingerprints differ)' : `${tensors.length} tensor(s): ${tensors.slice(0, listed).join(', ')}${tensors.length > listed ? ', ...' : ''}`}`);
  return {
    code: 'E_RDZV_CONTENT_DIFFERS',
    message: `${what.join('; ')}. Every node must hold the same checkpoint byte for byte: copy it again to the node(s) named (weightd verify --model DIR on a node checks its files against what it loaded)`,
    details: { nodeRanks: differing.map((d) => d.node.nodeRank), tensors: differing.flatMap((d) => d.tensors.slice(0, listed)), field: 'content' },
  };
}

/** The verdicts a starting group fails with, as `recordVerdict`'s params. */
const verdict = {
  ofContent: ({ context, event }: Args): { verdict: Rejection } => {
    assertEvent(event, 'READY');
    return { verdict: contentVerdict(context, event)! };
  },
  ofJoin: ({ context, event }: Args) => {
    assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
    return { verdict: joinRejection(context, event, false)! };
  },
  ofTimeout: ({ context }: Args) => ({
    verdict: timeoutRejection(context.rendezvousTimeoutMs, context.expect.nnodes, context.members.map((m) => m.nodeRank), context.turnedAway, context.turnedAwayCount),
  }),
  ofReport: ({ context, event }: Args): { verdict: Rejection } => {
    assertEvent(event, 'NODE_FAILED');
    return {
      verdict: {
        code: 'E_RDZV_PEER_FAILED',
        message: `${describeNode(memberByRank(context, event.nodeRank) ?? { nodeRank: event.nodeRank })} failed: ${event.message}`,
        details: { nodeRank: event.nodeRank, field: 'node', causeCode: event.code },
      },
    };
  },
  ofAbort: ({ event }: Args): { verdict: Rejection } => {
    assertEvent(event, 'ABORT');
    return {
      verdict: {
        code: 'E_RDZV_PEER_FAILED',
        message: `${describeNode(event)} failed before joining: ${event.code}: ${event.message}`,
        details: { nodeRank: event.nodeRank, field: 'node', causeCode: event.code },
      },
    };
  },
  ofLoss: ({ context, event }: Args): { verdict: Rejection } => {
    assertEvent(event, 'LINK_CLOSED');
    const member = context.members.find((m) => m.linkId === event.linkId)!;
    return {
      verdict: {
        code: 'E_RDZV_PEER_LOST',
        message:
          `${describeNode(member)} disconnected before the group was ready (${event.reason}); start-up is all-or-nothing, ` +
          'so every node fails: find why it stopped in its own log, then restart every node',
        details: { nodeRank: member.nodeRank, field: 'node', reason: event.reason },
      },
    };
  },
};

/** The member an event takes down while serving, and why (also once it is marked lost). */
function lostMember(c: CoordinatorContext, e: CoordinatorEvent): { member: MemberRecord; reason: string } {
  assertEvent(e, ['LINK_CLOSED', 'NODE_FAILED']);
  return e.type === 'LINK_CLOSED'
    ? { member: c.members.find((m) => m.linkId === e.linkId)!, reason: e.reason }
    : { member: memberByRank(c, e.nodeRank)!, reason: `failed: ${e.message}` };
}

/** How many distinct turned-away joins the timeout verdict names; the rest are counted. */
const MAX_TURNED_AWAY_NAMED = 8;

/** How a connection without a valid token is named in the timeout verdict and in the log. */
function turnedAway(c: CoordinatorContext, e: CoordinatorEvent): { entry: string; line: string; code: string; nodeRank?: number; address: string } {
  assertEvent(e, ['JOIN', 'FOREIGN_JOIN', 'ABORT']);
  if (e.type === 'ABORT') {
    const node = describeNode(e);
    return { entry: `${node} (E_RDZV_TOKEN)`, line: `ignored a start-up failure report without a valid token from ${node}`, code: 'E_RDZV_TOKEN', nodeRank: e.nodeRank, address: e.address };
  }
  const r = admissionRefusal(c, e);
  const nodeRank = e.type === 'JOIN' ? e.join.nodeRank : e.nodeRank;
  return { entry: `${describeNode({ nodeRank: nodeRank ?? -1, address: e.address })} (${r.code})`, line: `turned away a join without a valid token: ${r.message}`, code: r.code, nodeRank, address: e.address };
}

/** Why a join without a valid token is refused: the first rule it breaks (the token, or one before it). */
function admissionRefusal(c: CoordinatorContext, e: JoinEvent): Rejection {
  return e.type === 'FOREIGN_JOIN' ? joinRejection(c, e, false)! : checkJoin(e.join, e.address, c.expect, e.nonce, [])!;
}

/** An action's body: running the machine without the connection side provided is a wiring bug. */
function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the coordinator's "${name}" action was not provided; create the machine with .provide({ actions }) (src/rendezvous/coordinatorServer.ts does)`);
}

const coordinatorSetup = setup({
  types: {
    context: {} as CoordinatorContext,
    events: {} as CoordinatorEvent,
    input: {} as CoordinatorInput,
  },
  delays: {
    rendezvousDeadline: ({ context }) => Math.max(0, context.startedAt + context.rendezvousTimeoutMs - performance.now()),
  },
  guards: {
    // With a token, only a node that proves it may decide the group's fate or hear its verdict:
    // anyone else who can reach the port is turned away alone, so a stranger cannot fail a
    // loading cluster. A real node with a wrong token fails by itself, and the others name it
    // when their rendezvous times out.
    unproven: ({ context, event }) => {
      assertEvent(event, ['JOIN', 'FOREIGN_JOIN', 'ABORT']);
      const token = context.expect.token;
      if (token === undefined) return false;
      // A join of another version carries no proof this side can read.
      if (event.type === 'FOREIGN_JOIN') return true;
      return !tokenAccepted(token, event.nonce, event.type === 'JOIN' ? event.join.tokenProof : event.tokenProof);
    },
    secondJoin: ({ context, event }) => {
      assertEvent(event, 'JOIN');
      return context.claims.some((c) => c.linkId === event.linkId);
    },
    joinBreaksRule: ({ context, event }) => {
      assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
      return joinRejection(context, event, false) !== undefined;
    },
    rejoinBreaksRule: ({ context, event }) => {
      assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
      return joinRejection(context, event, true) !== undefined;
    },
    completesGroup: ({ context }) => context.members.length + 1 === context.expect.nnodes,
    fromStranger: ({ context, event }) => {
      assertEvent(event, ['READY', 'LINK_FAILED']);
      return liveMember(context, event.linkId) === undefined;
    },
    fromMember: ({ context, event }) => {
      assertEvent(event, 'LINK_CLOSED');
      return liveMember(context, event.linkId) !== undefined;
    },
    fromServingMember: ({ context, event }) => {
      assertEvent(event, 'LINK_CLOSED');
      return liveMember(context, event.linkId)?.state === 'ready';
    },
    alreadyReady: ({ context, event }) => {
      assertEvent(event, 'READY');
      return liveMember(context, event.linkId)?.state !== 'joined';
    },
    lastToBeReady: ({ context, event }) => {
      assertEvent(event, 'READY');
      return context.members.every((m) => m.linkId === event.linkId || m.state === 'ready');
    },
    // The barrier's last report completes what the nodes hold: any node whose bytes differ from
    // node 0's fails the group (nodeContent.ts).
    contentDiffers: ({ context, event }) => {
      assertEvent(event, 'READY');
      return contentVerdict(context, event) !== undefined;
    },
    // A failure report of a node already gone changes nothing.
    reportOfLostNode: ({ context, event }) => {
      assertEvent(event, 'NODE_FAILED');
      return memberByRank(context, event.nodeRank)?.state === 'lost';
    },
    // While serving, neither does one of a node that is not in the group.
    reportOfNoMember: ({ context, event }) => {
      assertEvent(event, 'NODE_FAILED');
      const m = memberByRank(context, event.nodeRank);
      return m === undefined || m.state === 'lost';
    },
    reportOfServingNode: ({ context, event }) => {
      assertEvent(event, 'NODE_FAILED');
      return memberByRank(context, event.nodeRank)?.state === 'ready';
    },
    // That node's clock ran out before ours (it started earlier): the same verdict either way,
    // and this side knows exactly which nodes are missing.
    peerTimedOut: ({ event }) => {
      assertEvent(event, 'NODE_FAILED');
      return event.code === 'E_RDZV_TIMEOUT';
    },
    // The deadline bounds the wait for nodes that may never have started; once the rank table
    // is out, every node did, and each hears the verdict or is known gone.
    beforeRankTable: ({ context }) => context.rankTable.length === 0,
    everyoneHeard: ({ context }) =>
      context.telling.length === 0 && allRanks(context).every((r) => context.told.includes(r) || memberByRank(context, r)?.state === 'lost'),
    noVerdictInFlight: ({ context }) => context.telling.length === 0,
  },
  actions: {
    // What the connection side does (src/rendezvous/coordinatorServer.ts provides them).
    send: (_, _p: { linkIds: number[]; message: ServerMessage }) => notProvided('send'),
    /** `rejected` to that connection alone, then it is closed. */
    refuse: (_, _p: { linkId: number; rejection: Rejection }) => notProvided('refuse'),
    /** The verdict to each, then each is closed and reported back as VERDICT_SENT. */
    tell: (_, _p: { claims: Claim[]; verdict: Rejection }) => notProvided('tell'),
    closeLink: (_, _p: { linkId: number; reason: string }) => notProvided('closeLink'),
    /** A protocol violation: logged and cut. */
    dropLink: (_, _p: { linkId: number; what: string; peer?: number }) => notProvided('dropLink'),

    claim: assign({
      claims: ({ context, event }) => {
        assertEvent(event, ['JOIN', 'FOREIGN_JOIN', 'ABORT']);
        return [...context.claims, { linkId: event.linkId, nodeRank: event.type === 'ABORT' ? event.nodeRank : claimedRank(event) }];
      },
    }),
    forgetLink: assign({
      claims: ({ context, event }) => {
        assertEvent(event, 'LINK_CLOSED');
        return context.claims.filter((c) => c.linkId !== event.linkId);
      },
    }),
    // Bounded: every join without a valid token is one, and a stranger can send thousands a
    // second. The verdict names the first few distinct ones and counts the rest.
    recordTurnedAway: assign(({ context, event }) => {
      const { entry } = turnedAway(context, event);
      const known = context.turnedAway.includes(entry) || context.turnedAway.length >= MAX_TURNED_AWAY_NAMED;
      return { turnedAway: known ? context.turnedAway : [...context.turnedAway, entry], turnedAwayCount: context.turnedAwayCount + 1 };
    }),
    logTurnedAway: ({ context, event }) => {
      const t = turnedAway(context, event);
      context.strangerLog.allow(() => context.log.warn({ code: t.code, peer: t.nodeRank, remote: t.address }, t.line));
    },
    admit: assign({
      members: ({ context, event }) => {
        assertEvent(event, 'JOIN');
        return [...context.members, memberOf(event)];
      },
    }),
    logJoined: ({ context, event }) => {
      assertEvent(event, 'JOIN');
      const m = memberOf(event);
      context.log.info({ peer: m.nodeRank, host: m.hostName, remote: m.address, joined: context.members.length, of: context.expect.nnodes }, `${describeNode(m)} joined`);
    },
    publishRankTable: assign({ rankTable: ({ context }) => groupRankTable(context.members) }),
    logRankTable: ({ context }) => context.log.info({ ranks: context.rankTable.length }, 'every node joined: rank table published'),
    markReady: assign({
      members: ({ context, event }) => {
        assertEvent(event, 'READY');
        return context.members.map((m) => (m.linkId === event.linkId && m.state !== 'lost' ? { ...m, state: 'ready' as const, content: event.content } : m));
      },
    }),
    logGroupReady: ({ context }) => context.log.info({ nnodes: context.expect.nnodes }, 'every node reported ready: group-ready sent to all'),
    // A member's own report counts as its node rank's NODE_FAILED.
    raiseMemberFailure: raise(({ context, event }) => {
      assertEvent(event, 'LINK_FAILED');
      return { type: 'NODE_FAILED' as const, nodeRank: liveMember(context, event.linkId)!.nodeRank, code: event.code, message: event.message };
    }),
    // A serving group is not failed by a bad newcomer: only that node hears why.
    logRefusal: ({ context, event }) => {
      assertEvent(event, ['JOIN', 'FOREIGN_JOIN']);
      const r = joinRejection(context, event, true)!;
      context.log.warn({ code: r.code, peer: claimedRank(event) }, `refused a join: ${r.message}`);
    },
    admitRejoin: assign(({ context, event }) => {
      assertEvent(event, 'JOIN');
      const members = [...context.members.filter((m) => m.nodeRank !== event.join.nodeRank), memberOf(event)];
      return { members, rankTable: groupRankTable(members) };
    }),
    logRejoining: ({ context, event }) => {
      assertEvent(event, 'JOIN');
      const m = memberOf(event);
      context.log.info({ peer: m.nodeRank, host: m.hostName, remote: m.address }, `${describeNode(m)} is rejoining; it loads, then reports ready`);
    },
    logRejoined: ({ context, event }) => {
      assertEvent(event, 'READY');
      const m = liveMember(context, event.linkId)!;
      context.log.info({ peer: m.nodeRank }, `${describeNode(m)} rejoined and is serving`);
    },
    markLostMember: assign({
      members: ({ context, event }) => {
        const { member } = lostMember(context, event);
        return context.members.map((m) => (m === member ? { ...m, state: 'lost' as const } : m));
      },
    }),
    logLost: ({ context, event }) => {
      const { member, reason } = lostMember(context, event);
      context.log.warn({ peer: member.nodeRank, reason }, `${describeNode(member)} lost; the other nodes keep serving`);
    },
    logRejoinLost: ({ context, event }) => {
      const { member, reason } = lostMember(context, event);
      context.log.warn({ peer: member.nodeRank, reason }, `${describeNode(member)} did not finish rejoining`);
    },
    // A serving (or failed) group is not failed by a node that could not start.
    logAbort: ({ context, event }) => {
      assertEvent(event, 'ABORT');
      context.log.warn({ peer: event.nodeRank, code: event.code }, `${describeNode(event)} could not start: ${event.message}`);
    },
    recordVerdict: assign({ verdict: (_, params: { verdict: Rejection }) => params.verdict }),
    logVerdict: ({ context }) => {
      const v = context.verdict!;
      context.log.error({ code: v.code, peer: v.details.nodeRank, field: v.details.field }, `group failed: ${v.message}`);
    },
    recordTelling: assign({ telling: ({ context }, params: { claims: Claim[] }) => [...context.telling, ...params.claims] }),
    recordTold: assign(({ context, event }) => {
      assertEvent(event, 'VERDICT_SENT');
      return { telling: context.telling.filter((c) => c.linkId !== event.linkId), told: event.nodeRank >= 0 ? [...context.told, event.nodeRank] : context.told };
    }),
  },
});

const secondJoin = { guard: 'secondJoin', actions: { type: 'dropLink', params: to.secondJoin } } as const;
/** Admission, the same in every phase. */
const turnAwayJoin = { guard: 'unproven', actions: ['recordTurnedAway', 'logTurnedAway', { type: 'refuse', params: to.turnedAway }] } as const;
const turnAwayAbort = { guard: 'unproven', actions: ['recordTurnedAway', 'logTurnedAway', { type: 'closeLink', params: to.abortRefused }] } as const;

/** Before the group is ready, every failure fails it; these are handled alike in gathering and loading. */
const startupFailures = {
  ABORT: [turnAwayAbort, { target: '#coordinator.failed', actions: ['claim', { type: 'recordVerdict', params: verdict.ofAbort }] }],
  LINK_FAILED: [{ guard: 'fromStranger', actions: { type: 'dropLink', params: to.stranger } }, { actions: 'raiseMemberFailure' }],
  LINK_CLOSED: [
    { guard: 'fromMember', target: '#coordinator.failed', actions: ['markLostMember', { type: 'recordVerdict', params: verdict.ofLoss }, 'forgetLink'] },
    { actions: 'forgetLink' },
  ],
} as const;

const failOnJoin = { target: '#coordinator.failed', actions: ['claim', { type: 'recordVerdict', params: verdict.ofJoin }] } as const;
const tellLatecomer = ['claim', { type: 'recordTelling', params: to.latecomer }, { type: 'tell', params: to.latecomer }] as const;

export const coordinatorMachine = coordinatorSetup.createMachine({
  id: 'coordinator',
  initial: 'gathering',
  context: ({ input }) => ({ ...input, claims: [], members: [], rankTable: [], turnedAway: [], turnedAwayCount: 0, told: [], telling: [] }),
  states: {
    gathering: {
      after: { rendezvousDeadline: { target: 'failed.pastDeadline', actions: { type: 'recordVerdict', params: verdict.ofTimeout } } },
      on: {
        JOIN: [
          secondJoin,
          turnAwayJoin,
          { guard: 'joinBreaksRule', ...failOnJoin },
          {
            guard: 'completesGroup',
            target: 'loading',
            actions: ['claim', 'admit', 'logJoined', 'publishRankTable', 'logRankTable', { type: 'send', params: to.rankTable }],
          },
          { actions: ['claim', 'admit', 'logJoined', { type: 'send', params: to.waiting }] },
        ],
        FOREIGN_JOIN: [turnAwayJoin, failOnJoin],
        READY: [{ guard: 'fromStranger', actions: { type: 'dropLink', params: to.stranger } }, { actions: { type: 'dropLink', params: to.earlyReady } }],
        NODE_FAILED: [
          { guard: 'reportOfLostNode' },
          { guard: 'peerTimedOut', target: 'failed', actions: { type: 'recordVerdict', params: verdict.ofTimeout } },
          { target: 'failed', actions: { type: 'recordVerdict', params: verdict.ofReport } },
        ],
        ...startupFailures,
      },
    },
    // The ready barrier.
    loading: {
      on: {
        // Every node rank is taken, so any join breaks a rule (at least: a duplicate node rank).
        JOIN: [secondJoin, turnAwayJoin, { guard: 'joinBreaksRule', ...failOnJoin }],
        FOREIGN_JOIN: [turnAwayJoin, failOnJoin],
        READY: [
          { guard: 'fromStranger', actions: { type: 'dropLink', params: to.stranger } },
          { guard: 'alreadyReady' },
          { guard: and(['lastToBeReady', 'contentDiffers']), target: 'failed', actions: ['markReady', { type: 'recordVerdict', params: verdict.ofContent }] },
          { guard: 'lastToBeReady', target: 'serving', actions: ['markReady', 'logGroupReady', { type: 'send', params: to.groupReady }] },
          { actions: 'markReady' },
        ],
        NODE_FAILED: [{ guard: 'reportOfLostNode' }, { target: 'failed', actions: { type: 'recordVerdict', params: verdict.ofReport } }],
        ...startupFailures,
      },
    },
    serving: {
      on: {
        JOIN: [
          secondJoin,
          turnAwayJoin,
          { guard: 'rejoinBreaksRule', actions: ['claim', 'logRefusal', { type: 'refuse', params: to.refusal }] },
          { actions: ['claim', 'admitRejoin', 'logRejoining', { type: 'send', params: to.rejoinerTable }] },
        ],
        FOREIGN_JOIN: [turnAwayJoin, { actions: ['claim', 'logRefusal', { type: 'refuse', params: to.refusal }] }],
        ABORT: [turnAwayAbort, { actions: ['logAbort', { type: 'closeLink', params: to.abortNoted }] }],
        READY: [
          { guard: 'fromStranger', actions: { type: 'dropLink', params: to.stranger } },
          { guard: 'alreadyReady' },
          { actions: ['markReady', 'logRejoined', { type: 'send', params: to.rejoinerReady }, { type: 'send', params: to.peerBack }] },
        ],
        LINK_FAILED: [{ guard: 'fromStranger', actions: { type: 'dropLink', params: to.stranger } }, { actions: 'raiseMemberFailure' }],
        NODE_FAILED: [
          { guard: 'reportOfNoMember' },
          { guard: 'reportOfServingNode', actions: ['markLostMember', 'logLost', { type: 'send', params: to.peerLost }, { type: 'closeLink', params: to.failedNode }] },
          { actions: ['markLostMember', 'logRejoinLost', { type: 'closeLink', params: to.failedNode }] },
        ],
        LINK_CLOSED: [
          { guard: 'fromServingMember', actions: ['markLostMember', 'logLost', { type: 'send', params: to.peerLost }, 'forgetLink'] },
          { guard: 'fromMember', actions: ['markLostMember', 'logRejoinLost', 'forgetLink'] },
          { actions: 'forgetLink' },
        ],
      },
    },
    // Only joins are answered (with the verdict); whatever else the nodes still say changes nothing.
    failed: {
      initial: 'informing',
      entry: ['logVerdict', { type: 'recordTelling', params: to.claims }, { type: 'tell', params: to.claims }],
      on: {
        JOIN: [secondJoin, turnAwayJoin, { actions: tellLatecomer }],
        FOREIGN_JOIN: [turnAwayJoin, { actions: tellLatecomer }],
        ABORT: [turnAwayAbort, { actions: ['logAbort', { type: 'closeLink', params: to.abortNoted }] }],
        LINK_CLOSED: [{ guard: 'fromMember', actions: ['markLostMember', 'forgetLink'] }, { actions: 'forgetLink' }],
        VERDICT_SENT: { actions: 'recordTold' },
      },
      states: {
        // Until each node rank heard the verdict or is gone, or the deadline passes (a node that
        // never started cannot be told).
        informing: {
          always: { guard: 'everyoneHeard', target: 'delivered' },
          after: { rendezvousDeadline: { guard: 'beforeRankTable', target: 'pastDeadline' } },
        },
        // Verdicts already being written still go out before node 0 may end.
        pastDeadline: {
          always: { guard: 'noVerdictInFlight', target: 'delivered' },
        },
        delivered: {},
      },
    },
    closed: { type: 'final' },
  },
  on: { CLOSE: '.closed' },
});

/** The coordinator's phase: its top-level state. */
export type CoordinatorPhase = 'gathering' | 'loading' | 'serving' | 'failed' | 'closed';
