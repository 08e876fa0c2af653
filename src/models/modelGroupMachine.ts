// One model version that spans the group, loaded while the group serves (a checkpoint upgrade
// across nodes): node 0's coordinator runs one of these per model name being loaded. The swap is
// all-or-nothing, a two-phase commit over the rendezvous connections:
//
//   gathering: nodes join as each plans the model (the operator runs `weightd ctl load` on every
//              node); each must state the fingerprint and tp size of the first, and every node
//              must join before the rendezvous deadline. Each loads as soon as it has joined.
//   loading:   every node joined; waiting until each reports the version resident (allocated,
//              filled, its files checked) but not attachable.
//   committed: resident everywhere: every node is told to serve it (its older version drains).
//   aborted:   a node failed, vanished or disagreed, or the deadline passed: every node is told
//              to free it, with one verdict, and the older version serves on everywhere.
//
// It holds no connection: src/rendezvous/coordinatorServer.ts feeds it its members' messages and
// provides `send`, which writes to the nodes it names.
import { assertEvent, assign, setup } from 'xstate';
import type { ErrorCode } from '../errors.js';
import { WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import { describeNode, type Rejection } from '../rendezvous/checkJoin.js';
import type { ServerMessage } from '../rendezvous/groupMessages.js';
import { differingFingerprintFields } from '../checkpoint/differingFingerprintFields.js';

export interface ModelGroupInput {
  name: string;
  /** The first join's version: every other node must state the same. */
  fingerprint: string;
  fingerprintFields?: Record<string, string>;
  tpSize: number;
  nnodes: number;
  /** The node that joined first, with what it said. */
  firstNodeRank: number;
  /** Every node must join within this of the first (--rendezvous-timeout). */
  timeoutMs: number;
  log: Logger;
}

export interface ModelGroupContext extends ModelGroupInput {
  joined: number[];
  resident: number[];
  verdict?: Rejection;
  /** A join that stated another version: its node loads that one, so its abort must name it. */
  offender?: { nodeRank: number; fingerprint: string };
}

export type ModelGroupEvent =
  | { type: 'JOIN'; nodeRank: number; fingerprint: string; fingerprintFields?: Record<string, string>; tpSize: number }
  | { type: 'RESIDENT'; nodeRank: number }
  /** A node could not load it, or not even plan it (then it may not have joined). */
  | { type: 'FAILED'; nodeRank: number; code: string; message: string }
  /** The node's connection to node 0 is gone (or it failed as a whole). */
  | { type: 'NODE_LOST'; nodeRank: number; reason: string };

type Args = { context: ModelGroupContext; event: ModelGroupEvent };

const allRanks = (c: ModelGroupContext) => Array.from({ length: c.nnodes }, (_, r) => r);
const version = (c: ModelGroupContext) => ({ name: c.name, fingerprint: c.fingerprint });

function verdictOf(code: ErrorCode, message: string, details: Rejection['details']): Rejection {
  return { code, message, details };
}

/** Why a join does not belong to this group: it states another version or tp size. */
function joinMismatch(c: ModelGroupContext, e: Extract<ModelGroupEvent, { type: 'JOIN' }>): Rejection | undefined {
  const node = describeNode({ nodeRank: e.nodeRank });
  const first = describeNode({ nodeRank: c.firstNodeRank });
  if (e.tpSize !== c.tpSize) {
    return verdictOf(
      'E_MODEL_GROUP_MISMATCH',
      `model "${c.name}": ${node} loads it at tp ${e.tpSize}, ${first} at tp ${c.tpSize}; run weightd ctl load with the same --tensor-parallel-size on every node`,
      { nodeRank: e.nodeRank, field: 'tpSize', value: e.tpSize, expected: c.tpSize },
    );
  }
  if (e.fingerprint !== c.fingerprint) {
    const fields = c.fingerprintFields ? differingFingerprintFields(c.fingerprintFields, e.fingerprintFields) : ['fingerprint'];
    return verdictOf(
      'E_MODEL_GROUP_MISMATCH',
      `model "${c.name}": ${node}'s checkpoint has fingerprint ${e.fingerprint.slice(0, 12)}…, ${first}'s ${c.fingerprint.slice(0, 12)}… (fields that differ: ${fields.join(', ')}); ` +
        'every node must load the same checkpoint (same files, --plan-file and layouts): copy the same directory to every node',
      { nodeRank: e.nodeRank, field: 'fingerprint', value: e.fingerprint, expected: c.fingerprint, fields },
    );
  }
  return undefined;
}

/** The verdict when a node could not load (or plan) the version. */
export function peerFailedVerdict(name: string, nodeRank: number, code: string, message: string): Rejection {
  return verdictOf('E_MODEL_GROUP_PEER_FAILED', `model "${name}" failed on ${describeNode({ nodeRank })}: ${code}: ${message}`, { nodeRank, field: 'node', causeCode: code });
}

function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the model group's "${name}" action was not provided; create the machine with .provide({ actions }) (src/rendezvous/coordinatorServer.ts does)`);
}

const modelGroupSetup = setup({
  types: {
    context: {} as ModelGroupContext,
    events: {} as ModelGroupEvent,
    input: {} as ModelGroupInput,
  },
  delays: { joinDeadline: ({ context }) => context.timeoutMs },
  guards: {
    mismatch: ({ context, event }) => (assertEvent(event, 'JOIN'), joinMismatch(context, event) !== undefined),
    alreadyJoined: ({ context, event }) => (assertEvent(event, 'JOIN'), context.joined.includes(event.nodeRank)),
    completesGroup: ({ context, event }) => (assertEvent(event, 'JOIN'), context.joined.length + 1 === context.nnodes),
    notJoined: ({ context, event }) => (assertEvent(event, 'RESIDENT'), !context.joined.includes(event.nodeRank)),
    residentEverywhere: ({ context }) => context.joined.length === context.nnodes && allRanks(context).every((r) => context.resident.includes(r)),
    // A node that has not joined this group has nothing of it to lose.
    memberLost: ({ context, event }) => (assertEvent(event, 'NODE_LOST'), context.joined.includes(event.nodeRank)),
  },
  actions: {
    /** What the connection side writes: `message` to each of these node ranks still connected. */
    send: (_, _p: { nodeRanks: number[]; message: ServerMessage }) => notProvided('send'),
    join: assign({ joined: ({ context, event }) => (assertEvent(event, 'JOIN'), [...context.joined, event.nodeRank].sort((a, b) => a - b)) }),
    markResident: assign({
      resident: ({ context, event }) => (assertEvent(event, 'RESIDENT'), context.resident.includes(event.nodeRank) ? context.resident : [...context.resident, event.nodeRank]),
    }),
    recordVerdict: assign({ verdict: (_, p: { verdict: Rejection }) => p.verdict }),
    recordOffender: assign({ offender: ({ event }) => (assertEvent(event, 'JOIN'), { nodeRank: event.nodeRank, fingerprint: event.fingerprint }) }),
    logJoined: ({ context, event }) => {
      assertEvent(event, 'JOIN');
      context.log.info({ model: context.name, peer: event.nodeRank, joined: context.joined.length, of: context.nnodes }, `model "${context.name}": node ${event.nodeRank} joined its group`);
    },
    logCommitted: ({ context }) => context.log.info({ model: context.name, fingerprint: context.fingerprint }, `model "${context.name}" is resident on every node: commit sent to all`),
    logAborted: ({ context }) => {
      const v = context.verdict!;
      context.log.error({ model: context.name, code: v.code, peer: v.details.nodeRank }, `model group "${context.name}" aborted: ${v.message}`);
    },
  },
});

const to = {
  waiting: ({ context }: Args) => ({
    nodeRanks: context.joined,
    message: { type: 'model_waiting', ...version(context), joined: context.joined, missing: allRanks(context).filter((r) => !context.joined.includes(r)) } as const,
  }),
  commit: ({ context }: Args) => ({ nodeRanks: allRanks(context), message: { type: 'model_commit', ...version(context) } as const }),
  // Every node hears the verdict, also one that never joined (it may be planning still).
  abort: ({ context }: Args) => ({ nodeRanks: allRanks(context), message: { type: 'model_abort', ...version(context), ...context.verdict! } as const }),
  offender: ({ context }: Args) => {
    const o = context.offender!;
    return { nodeRanks: [o.nodeRank], message: { type: 'model_abort', name: context.name, fingerprint: o.fingerprint, ...context.verdict! } as const };
  },
};

const verdict = {
  ofJoin: ({ context, event }: Args) => (assertEvent(event, 'JOIN'), { verdict: joinMismatch(context, event)! }),
  ofFailure: ({ context, event }: Args) => (assertEvent(event, 'FAILED'), { verdict: peerFailedVerdict(context.name, event.nodeRank, event.code, event.message) }),
  ofLoss: ({ context, event }: Args) => {
    assertEvent(event, 'NODE_LOST');
    return {
      verdict: verdictOf(
        'E_MODEL_GROUP_PEER_LOST',
        `model "${context.name}": ${describeNode({ nodeRank: event.nodeRank })} was lost during its load (${event.reason}); a swap across nodes is all-or-nothing, so it was aborted everywhere`,
        { nodeRank: event.nodeRank, field: 'node', reason: event.reason },
      ),
    };
  },
  ofTimeout: ({ context }: Args) => {
    const missing = allRanks(context).filter((r) => !context.joined.includes(r));
    return {
      verdict: verdictOf(
        'E_MODEL_GROUP_TIMEOUT',
        `model "${context.name}": node rank${missing.length === 1 ? '' : 's'} ${missing.join(', ')} did not load it within ${context.timeoutMs / 1000} s of node ${context.firstNodeRank} ` +
          `(joined: ${context.joined.join(', ')}); run weightd ctl load with the same checkpoint on every node at about the same time, or raise --rendezvous-timeout`,
        { field: 'nodeRank', missing, joined: context.joined },
      ),
    };
  },
};

const abort = (reason: (a: Args) => { verdict: Rejection }) => ({ target: '#modelGroup.aborted', actions: [{ type: 'recordVerdict', params: reason }] }) as const;

/** What a member may say in either phase before the verdict. */
const memberReports = {
  RESIDENT: [{ guard: 'notJoined' }, { actions: 'markResident' }],
  FAILED: abort(verdict.ofFailure),
  NODE_LOST: [{ guard: 'memberLost', ...abort(verdict.ofLoss) }],
} as const;

export const modelGroupMachine = modelGroupSetup.createMachine({
  id: 'modelGroup',
  initial: 'gathering',
  context: ({ input }) => ({ ...input, joined: [input.firstNodeRank], resident: [] }),
  states: {
    gathering: {
      entry: { type: 'send', params: to.waiting },
      after: { joinDeadline: abort(verdict.ofTimeout) },
      on: {
        JOIN: [
          { guard: 'alreadyJoined' },
          {
            guard: 'mismatch',
            target: '#modelGroup.aborted',
            actions: ['recordOffender', { type: 'recordVerdict', params: verdict.ofJoin }, { type: 'send', params: to.offender }],
          },
          { guard: 'completesGroup', target: 'loading', actions: ['join', 'logJoined'] },
          { actions: ['join', 'logJoined', { type: 'send', params: to.waiting }] },
        ],
        ...memberReports,
      },
    },
    // Every node has joined: a node loads one version of a name at a time, so no join comes now.
    loading: {
      always: { guard: 'residentEverywhere', target: 'committed' },
      on: memberReports,
    },
    committed: { type: 'final', entry: ['logCommitted', { type: 'send', params: to.commit }] },
    aborted: { type: 'final', entry: ['logAborted', { type: 'send', params: to.abort }] },
  },
});
