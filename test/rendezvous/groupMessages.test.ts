// The rendezvous message set on the shared frame codec: what a peer may send, what is refused,
// and how a join from another protocol version stays readable enough to be named.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ProtocolError } from '../../src/errors.js';
import { encodeFrame, encodeMessage } from '../../src/wire/frameCodec.js';
import {
  createRdzvDecoder, encodeRdzvMessage, MAX_RDZV_FRAME_BYTES, parseClientMessage, parseServerMessage, RDZV_PROTOCOL_VERSION, type JoinMessage,
} from '../../src/rendezvous/groupMessages.js';
import { FINGERPRINT } from './groupHarness.js';

const join: JoinMessage = {
  type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, nnodes: 2, tpSize: 4, localWorldSize: 2, nodeRank: 1, hostName: 'b',
  deviceUuids: ['GPU-1', 'GPU-2'], visibleDevices: 2, fingerprint: FINGERPRINT, tokenProof: null,
};

function decodeAll(frames: Buffer): Buffer[] {
  return createRdzvDecoder().push(frames);
}

test('a join survives a round trip, split into single bytes', () => {
  const frame = encodeRdzvMessage(join);
  const decoder = createRdzvDecoder();
  const out: Buffer[] = [];
  for (const byte of frame) out.push(...decoder.push(Buffer.from([byte])));
  assert.is(out.length, 1);
  assert.equal(parseClientMessage(out[0]!), { message: join });
});

test('two frames in one chunk are two messages', () => {
  const both = Buffer.concat([encodeRdzvMessage({ type: 'heartbeat' }), encodeRdzvMessage({ type: 'peer_back', nodeRank: 3 })]);
  assert.equal(decodeAll(both).map(parseServerMessage), [{ type: 'heartbeat' }, { type: 'peer_back', nodeRank: 3 }]);
});

test('another protocol is refused at its first byte', () => {
  try {
    createRdzvDecoder().push(Buffer.from('G'));
    assert.unreachable();
  } catch (err) {
    assert.instance(err, ProtocolError);
    assert.is((err as ProtocolError).code, 'E_FRAME_MAGIC');
  }
});

test('a frame over the bound is refused from its header, before its body arrives', () => {
  const header = Buffer.from(encodeMessage({ type: 'heartbeat' }).subarray(0, 10));
  header.writeUInt32BE(MAX_RDZV_FRAME_BYTES + 1, 6);
  assert.throws(() => createRdzvDecoder().push(header), (err: ProtocolError) => err.code === 'E_FRAME_TOO_LARGE');
});

test('a message over the bound is not sent', () => {
  const huge = { ...join, hostName: 'x'.repeat(MAX_RDZV_FRAME_BYTES) };
  assert.throws(() => encodeRdzvMessage(huge), (err: ProtocolError) => err.code === 'E_RDZV_FRAME_TOO_LARGE');
});

test('invalid JSON and schema violations are protocol errors that say what is wrong', () => {
  const notJson = Buffer.from('{"type":');
  assert.throws(() => parseClientMessage(notJson), (err: ProtocolError) => err.code === 'E_FRAME_JSON');
  const badRank = Buffer.from(JSON.stringify({ ...join, nodeRank: -1 }));
  assert.throws(() => parseClientMessage(badRank), (err: ProtocolError) => err.code === 'E_RDZV_SCHEMA' && /nodeRank/.test(err.message));
  const badProof = Buffer.from(JSON.stringify({ ...join, tokenProof: 'not base64' }));
  assert.throws(() => parseClientMessage(badProof), (err: ProtocolError) => /tokenProof/.test(err.message));
  const unknown = Buffer.from(JSON.stringify({ type: 'shutdown_everything' }));
  assert.throws(() => parseClientMessage(unknown), (err: ProtocolError) => err.code === 'E_RDZV_SCHEMA');
  assert.throws(() => parseServerMessage(Buffer.from(JSON.stringify({ type: 'joined', rankTable: 'all of it' }))), (err: Error) => err instanceof ProtocolError);
});

test('a join of another protocol version is read only for its version, rank and host', () => {
  const future = { type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION + 1, nodeRank: 2, hostName: 'c', someNewField: { x: 1 } };
  assert.equal(parseClientMessage(Buffer.from(JSON.stringify(future))), { foreignVersion: RDZV_PROTOCOL_VERSION + 1, nodeRank: 2, hostName: 'c' });
  const odd = { type: 'join', protocolVersion: 0, nodeRank: 'two' };
  assert.equal(parseClientMessage(Buffer.from(JSON.stringify(odd))), { foreignVersion: 0, nodeRank: undefined, hostName: undefined });
});

test('unknown fields from a newer peer are dropped, not refused', () => {
  const parsed = parseServerMessage(Buffer.from(JSON.stringify({ type: 'hello', protocolVersion: 1, nonce: 'n'.repeat(32), extra: true })));
  assert.equal(parsed, { type: 'hello', protocolVersion: 1, nonce: 'n'.repeat(32) });
});

test('a rendezvous frame nested past 128 levels is E_FRAME_JSON before JSON.parse runs', () => {
  const depth = (MAX_RDZV_FRAME_BYTES >> 1) - 8;
  const [payload] = decodeAll(encodeFrame(`${'{"a":['.repeat(depth / 6)}${']}'.repeat(depth / 6)}`));
  for (const parse of [parseClientMessage, parseServerMessage]) {
    assert.throws(() => parse(payload!), (e: unknown) => e instanceof ProtocolError && e.code === 'E_FRAME_JSON' && /nested 128 levels deep/.test(e.message));
  }
});

test.run();
