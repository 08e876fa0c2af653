// Every rule a join must pass, as a pure function: one case per rejection, each checked for
// its stable code, the node and field it names, and a fix in the message.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { checkJoin, timeoutRejection, tokenProof, type GroupExpectation, type NodeIdentity } from '../../src/rendezvous/checkJoin.js';
import { RDZV_PROTOCOL_VERSION, type JoinMessage } from '../../src/rendezvous/groupMessages.js';
import { FINGERPRINT } from './groupHarness.js';

const expect: GroupExpectation = { nnodes: 2, tpSize: 4, localWorldSize: 2, fingerprint: FINGERPRINT };
const nonce = 'n'.repeat(32);
const node0: NodeIdentity = { nodeRank: 0, hostName: 'a', address: '10.0.0.1:5000', deviceUuids: ['GPU-a0', 'GPU-a1'] };

function join(over: Partial<JoinMessage> = {}): JoinMessage {
  return {
    type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, nnodes: 2, tpSize: 4, localWorldSize: 2, nodeRank: 1, hostName: 'b',
    deviceUuids: ['GPU-b0', 'GPU-b1'], visibleDevices: 2, fingerprint: FINGERPRINT, tokenProof: null, ...over,
  };
}

function rejected(j: JoinMessage, e: GroupExpectation = expect, others = [node0]) {
  const r = checkJoin(j, '10.0.0.2:6000', e, nonce, others);
  assert.ok(r, 'rejected');
  return r!;
}

test('a well-formed join passes', () => {
  assert.is(checkJoin(join(), '10.0.0.2:6000', expect, nonce, [node0]), undefined);
});

const cases: Array<[string, JoinMessage, string, string, RegExp]> = [
  ['protocol version', join({ protocolVersion: 9 }), 'E_RDZV_VERSION_MISMATCH', 'protocolVersion', /node 1 \(b, 10\.0\.0\.2:6000\) speaks rendezvous protocol version 9.*same weightd release/],
  ['nnodes', join({ nnodes: 3 }), 'E_RDZV_NNODES_MISMATCH', 'nnodes', /node 1 \(b, .*\): --nnodes 3 differs from node 0's 2; pass the same --nnodes/],
  ['tensor-parallel size', join({ tpSize: 8 }), 'E_RDZV_TP_MISMATCH', 'tpSize', /--tensor-parallel-size 8 differs from node 0's 4/],
  ['local world size', join({ localWorldSize: 1, deviceUuids: ['GPU-b0'] }), 'E_RDZV_LOCAL_WORLD_SIZE_MISMATCH', 'localWorldSize', /local world size 1 differs from node 0's 2/],
  ['device list length', join({ deviceUuids: ['GPU-b0'] }), 'E_RDZV_LOCAL_WORLD_SIZE_MISMATCH', 'localWorldSize', /local world size 1/],
  ['node rank range', join({ nodeRank: 2 }), 'E_RDZV_NODE_RANK_RANGE', 'nodeRank', /--node-rank 2 is out of range for --nnodes 2; pass a node rank from 0 to 1/],
  ['duplicate node rank', join({ nodeRank: 0 }), 'E_RDZV_DUPLICATE_NODE_RANK', 'nodeRank', /--node-rank 0 is claimed by two nodes, node 0 \(a, 10\.0\.0\.1:5000\) and node \? \(b, 10\.0\.0\.2:6000\); give every node a distinct/],
  ['visible device count', join({ visibleDevices: 3 }), 'E_RDZV_DEVICE_COUNT', 'visibleDevices', /node 1 .* sees 3 devices, but every node must see exactly .* = 2 .*CUDA_VISIBLE_DEVICES/],
  ['device shared with another node', join({ deviceUuids: ['GPU-b0', 'GPU-a1'] }), 'E_RDZV_DUPLICATE_DEVICE', 'deviceUuids', /device GPU-a1 is claimed by node 0 \(a, .*\) local rank 1 and by node 1 \(b, .*\) local rank 1/],
  ['device used twice on one node', join({ deviceUuids: ['GPU-b0', 'GPU-b0'] }), 'E_RDZV_DUPLICATE_DEVICE', 'deviceUuids', /device GPU-b0 is claimed by node 1 .* local rank 0 and by node 1 .* local rank 1/],
  ['fingerprint', join({ fingerprint: 'b'.repeat(64) }), 'E_RDZV_FINGERPRINT_MISMATCH', 'fingerprint', /node 1 .*: checkpoint fingerprint "b{64}" differs from node 0's "a{64}"; every node must load the same checkpoint/],
];

for (const [what, j, code, field, message] of cases) {
  test(`rejects a different ${what}, naming the node and the field`, () => {
    const r = rejected(j);
    assert.is(r.code, code);
    assert.is(r.details.field, field);
    assert.match(r.message, message);
  });
}

test('token: wrong, missing and unexpected are told apart, and a right one passes', () => {
  const withToken = { ...expect, token: 's3cret' };
  const right = join({ tokenProof: tokenProof('s3cret', nonce) });
  assert.is(checkJoin(right, '', withToken, nonce, [node0]), undefined);
  const wrong = rejected(join({ tokenProof: tokenProof('guess', nonce) }), withToken);
  assert.is(wrong.code, 'E_RDZV_TOKEN');
  assert.match(wrong.message, /node 1 .* presented a wrong --weight-cache-token; pass the same token \(or WEIGHTD_TOKEN\)/);
  assert.match(rejected(join(), withToken).message, /presented no --weight-cache-token but node 0 requires one/);
  assert.match(rejected(right).message, /presented a --weight-cache-token but node 0 runs without one/);
  // A proof is bound to its connection's nonce: replaying it on another connection fails.
  assert.is(checkJoin(right, '', withToken, 'm'.repeat(32), [node0])?.code, 'E_RDZV_TOKEN');
});

test('the token is checked before any other field, so a stranger learns nothing', () => {
  const r = rejected(join({ nnodes: 7, fingerprint: 'x' }), { ...expect, token: 't' });
  assert.is(r.code, 'E_RDZV_TOKEN');
  assert.not.match(r.message, /nnodes|fingerprint/);
});

test('a device on two nodes is named in node-rank order, whichever node joined first', () => {
  // Node 1 is already in the group when node 0 joins with node 1's device.
  const node1 = { nodeRank: 1, hostName: 'b', address: '10.0.0.2:6000', deviceUuids: ['GPU-b0', 'GPU-b1'] };
  const r = checkJoin(join({ nodeRank: 0, hostName: 'a', deviceUuids: ['GPU-a0', 'GPU-b1'] }), '10.0.0.1:5000', expect, nonce, [node1]);
  assert.is(r?.code, 'E_RDZV_DUPLICATE_DEVICE');
  assert.match(r!.message, /^device GPU-b1 is claimed by node 0 \(a, 10\.0\.0\.1:5000\) local rank 1 and by node 1 \(b, 10\.0\.0\.2:6000\) local rank 1;/);
});

test('a single node skips the uniform-node device count, not the device duplicates', () => {
  const single = { nnodes: 1, tpSize: 2, localWorldSize: 2, fingerprint: FINGERPRINT };
  assert.is(checkJoin(join({ nnodes: 1, tpSize: 2, nodeRank: 0, visibleDevices: 8 }), '', single, '', []), undefined);
  assert.is(checkJoin(join({ nnodes: 1, tpSize: 2, nodeRank: 0, deviceUuids: ['x', 'x'] }), '', single, '', [])?.code, 'E_RDZV_DUPLICATE_DEVICE');
});

test('the timeout names the missing node ranks and the joined ones', () => {
  const r = timeoutRejection(2500, 4, [2, 0]);
  assert.is(r.code, 'E_RDZV_TIMEOUT');
  assert.equal(r.details.missing, [1, 3]);
  assert.match(r.message, /^rendezvous timed out after 2\.5 s: node ranks 1, 3 never joined \(joined: 0, 2\); .*raise --rendezvous-timeout$/);
  assert.match(timeoutRejection(1000, 2, [0]).message, /node rank 1 never joined/);
});

test.run();
