// Whether a node may join the group: every rule the coordinator enforces before anyone loads,
// as one pure function, so a single node (no coordinator) is checked by the very same code.
// Each rejection names the node and the field, shows both values and says what to change; the
// same text is sent to every node, so it is written to read well on any of them.
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import type { ErrorCode } from '../errors.js';
import { differingFingerprintFields } from '../checkpoint/differingFingerprintFields.js';
import type { JoinMessage } from './groupMessages.js';
import { RDZV_PROTOCOL_VERSION } from './groupMessages.js';

/** What node 0 requires of every node: its own configuration. */
export interface GroupExpectation {
  nnodes: number;
  tpSize: number;
  localWorldSize: number;
  fingerprint: string;
  /** The fingerprint's per-field hashes, to name the fields a mismatching node differs in. */
  fingerprintFields?: Record<string, string>;
  /** The checkpoint's tensors, in the order nodes report their digests at the ready barrier (nodeContent.ts). */
  tensorNames?: readonly string[];
  token?: string;
}

/** A node already accepted (or being checked), as rejections name it. */
export interface NodeIdentity {
  nodeRank: number;
  hostName: string;
  /** Where its connection comes from; empty for the local node. */
  address: string;
  deviceUuids: string[];
}

export interface Rejection {
  code: ErrorCode;
  message: string;
  details: { nodeRank?: number; field: string; value?: unknown; expected?: unknown; [key: string]: unknown };
}

export function describeNode(n: { nodeRank?: number; hostName?: string; address?: string }): string {
  const where = [n.hostName, n.address].filter(Boolean).join(', ');
  return `node ${n.nodeRank ?? '?'}${where ? ` (${where})` : ''}`;
}

/** The token proof a joining node sends: HMAC-SHA256 of the coordinator's nonce; null when it has no token. */
export function tokenProof(token: string | undefined, nonce: string): string | null {
  return token ? createHmac('sha256', token).update(nonce).digest('base64') : null;
}

/** Constant-time: a wrong token takes as long to refuse as a nearly right one. */
function proofMatches(expected: string, actual: string): boolean {
  const a = createHash('sha256').update(expected).digest();
  const b = createHash('sha256').update(actual).digest();
  return timingSafeEqual(a, b);
}

/** Whether a join's proof shows it holds `token` (constant time). */
export function tokenAccepted(token: string, nonce: string, proof: string | null): boolean {
  return proof !== null && proofMatches(tokenProof(token, nonce)!, proof);
}

export function rejectVersion(node: { nodeRank?: number; hostName?: string; address?: string }, version: number): Rejection {
  return {
    code: 'E_RDZV_VERSION_MISMATCH',
    message:
      `${describeNode(node)} speaks rendezvous protocol version ${version}, node 0 speaks ${RDZV_PROTOCOL_VERSION}: ` +
      'run the same weightd release on every node',
    details: { nodeRank: node.nodeRank, field: 'protocolVersion', value: version, expected: RDZV_PROTOCOL_VERSION },
  };
}

function mismatch(code: ErrorCode, node: string, field: string, flag: string, value: unknown, expected: unknown, fix: string, nodeRank: number): Rejection {
  return {
    code,
    message: `${node}: ${flag} ${JSON.stringify(value)} differs from node 0's ${JSON.stringify(expected)}; ${fix}`,
    details: { nodeRank, field, value, expected },
  };
}

/**
 * Checks `join` from a connection at `address` against node 0's expectation and the nodes
 * already in the group (`others`, which must not include an earlier incarnation of this node).
 * `nonce` is the one this connection's hello carried. Returns the first rule broken, if any.
 */
export function checkJoin(join: JoinMessage, address: string, expect: GroupExpectation, nonce: string, others: NodeIdentity[]): Rejection | undefined {
  const rank = join.nodeRank;
  const node = describeNode({ nodeRank: rank, hostName: join.hostName, address });
  if (join.protocolVersion !== RDZV_PROTOCOL_VERSION) return rejectVersion({ nodeRank: rank, hostName: join.hostName, address }, join.protocolVersion);

  // The token comes before any other field, so a node without it learns nothing about the group.
  const wanted = tokenProof(expect.token, nonce);
  if (wanted === null || join.tokenProof === null) {
    if (wanted !== join.tokenProof) {
      const problem = wanted === null ? 'presented a --weight-cache-token but node 0 runs without one' : 'presented no --weight-cache-token but node 0 requires one';
      return { code: 'E_RDZV_TOKEN', message: `${node} ${problem}; pass the same token (or WEIGHTD_TOKEN) to every node, or to none`, details: { nodeRank: rank, field: 'token' } };
    }
  } else if (!proofMatches(wanted, join.tokenProof)) {
    return { code: 'E_RDZV_TOKEN', message: `${node} presented a wrong --weight-cache-token; pass the same token (or WEIGHTD_TOKEN) to every node`, details: { nodeRank: rank, field: 'token' } };
  }

  if (join.nnodes !== expect.nnodes) {
    return mismatch('E_RDZV_NNODES_MISMATCH', node, 'nnodes', '--nnodes', join.nnodes, expect.nnodes, 'pass the same --nnodes to every node', rank);
  }
  if (join.tpSize !== expect.tpSize) {
    return mismatch('E_RDZV_TP_MISMATCH', node, 'tpSize', '--tensor-parallel-size', join.tpSize, expect.tpSize, 'pass the same --tensor-parallel-size to every node', rank);
  }
  if (join.localWorldSize !== expect.localWorldSize || join.deviceUuids.length !== expect.localWorldSize) {
    const value = join.localWorldSize !== expect.localWorldSize ? join.localWorldSize : join.deviceUuids.length;
    return mismatch(
      'E_RDZV_LOCAL_WORLD_SIZE_MISMATCH', node, 'localWorldSize', 'local world size', value, expect.localWorldSize,
      `every node runs tensor-parallel-size / nnodes = ${expect.localWorldSize} local ranks`, rank,
    );
  }
  if (rank >= expect.nnodes) {
    return {
      code: 'E_RDZV_NODE_RANK_RANGE',
      message: `${node}: --node-rank ${rank} is out of range for --nnodes ${expect.nnodes}; pass a node rank from 0 to ${expect.nnodes - 1}`,
      details: { nodeRank: rank, field: 'nodeRank', value: rank },
    };
  }
  const twin = others.find((o) => o.nodeRank === rank);
  if (twin) {
    return {
      code: 'E_RDZV_DUPLICATE_NODE_RANK',
      message: `--node-rank ${rank} is claimed by two nodes, ${describeNode(twin)} and ${describeNode({ hostName: join.hostName, address })}; give every node a distinct --node-rank from 0 to ${expect.nnodes - 1}`,
      details: { nodeRank: rank, field: 'nodeRank', value: rank, hosts: [twin.hostName, join.hostName] },
    };
  }
  if (expect.nnodes > 1 && join.visibleDevices !== expect.localWorldSize) {
    return {
      code: 'E_RDZV_DEVICE_COUNT',
      message:
        `${node} sees ${join.visibleDevices} devices, but every node must see exactly tensor-parallel-size / nnodes = ${expect.localWorldSize} ` +
        `(nodes must be uniform, so that global ranks match the engine's); make exactly ${expect.localWorldSize} devices visible on it ` +
        '(CUDA_VISIBLE_DEVICES, or WEIGHTD_HOST_DEVICES for the host backend)',
      details: { nodeRank: rank, field: 'visibleDevices', value: join.visibleDevices, expected: expect.localWorldSize },
    };
  }
  const duplicate = findDuplicateDevice({ nodeRank: rank, hostName: join.hostName, address, deviceUuids: join.deviceUuids }, others);
  if (duplicate) return duplicate;
  if (join.fingerprint !== expect.fingerprint) {
    // Either side may lack the fields (an older node): then the fingerprint itself is named.
    const fields = expect.fingerprintFields ? differingFingerprintFields(expect.fingerprintFields, join.fingerprintFields) : ['fingerprint'];
    const rejection = mismatch(
      'E_RDZV_FINGERPRINT_MISMATCH', node, 'fingerprint', 'checkpoint fingerprint', join.fingerprint, expect.fingerprint,
      'every node must load the same checkpoint (same files, architecture, dtype and --plan-file) with the same weightd release', rank,
    );
    return { ...rejection, message: `${rejection.message} (fields that differ: ${fields.join(', ')})`, details: { ...rejection.details, fields } };
  }
  return undefined;
}

/** A device UUID used twice, within the node or against a node already in the group. */
function findDuplicateDevice(node: NodeIdentity, others: NodeIdentity[]): Rejection | undefined {
  const seen = new Map<string, { owner: NodeIdentity; localRank: number }>();
  for (const owner of others) owner.deviceUuids.forEach((uuid, localRank) => seen.set(uuid, { owner, localRank }));
  for (const [localRank, uuid] of node.deviceUuids.entries()) {
    const first = seen.get(uuid);
    if (first) {
      // Named in node-rank order, whichever joined first, so every node prints the same line.
      const [a, b] = [first, { owner: node, localRank }].sort((x, y) => x.owner.nodeRank - y.owner.nodeRank || x.localRank - y.localRank);
      return {
        code: 'E_RDZV_DUPLICATE_DEVICE',
        message:
          `device ${uuid} is claimed by ${describeNode(a!.owner)} local rank ${a!.localRank} and by ${describeNode(b!.owner)} local rank ${b!.localRank}; ` +
          'every rank needs its own device: check CUDA_VISIBLE_DEVICES (WEIGHTD_HOST_DEVICES for the host backend) on both',
        details: { nodeRank: node.nodeRank, field: 'deviceUuids', value: uuid, otherNodeRank: first.owner.nodeRank },
      };
    }
    seen.set(uuid, { owner: node, localRank });
  }
  return undefined;
}

/** The verdict when the rendezvous timeout passes with nodes missing; names them. */
/**
 * `turnedAway` names joins refused without failing the group (no valid token): a misconfigured
 * node shows up here, at the timeout, on every node; `turnedAwayCount` counts them all (the
 * coordinator names the first few distinct ones).
 */
export function timeoutRejection(timeoutMs: number, nnodes: number, joined: number[], turnedAway: string[] = [], turnedAwayCount = turnedAway.length): Rejection {
  const missing = Array.from({ length: nnodes }, (_, r) => r).filter((r) => !joined.includes(r));
  const more = turnedAwayCount > turnedAway.length ? ` (${turnedAwayCount} joins turned away in all)` : '';
  const refused = turnedAway.length ? `; turned away: ${turnedAway.join('; ')}${more}` : '';
  return {
    code: 'E_RDZV_TIMEOUT',
    message:
      `rendezvous timed out after ${timeoutMs / 1000} s: node rank${missing.length === 1 ? '' : 's'} ${missing.join(', ')} never joined ` +
      `(joined: ${joined.length ? [...joined].sort((a, b) => a - b).join(', ') : 'none'}); start every node with the same --nnodes ${nnodes}, ` +
      `--master-addr and --weight-cache-master-port, or raise --rendezvous-timeout${refused}`,
    details: { field: 'nodeRank', missing, joined, turnedAway, turnedAwayCount },
  };
}
