// The TypeScript side of the keeper's wire format (docs/spec/keeper-wire.md) against the shared
// vectors: its constants, every request it encodes, every reply it decodes or refuses.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KeeperError, ProtocolError } from '../../src/errors.js';
import {
  decodeDrop, decodeEmpty, decodeList, decodePing, decodeTake, encodeDrop, encodeKeep, encodeList, encodePing, encodeTake, encodeWatch, keepPayloadBytes,
  KEEPER_HEADER_BYTES, KEEPER_MAGIC, KEEPER_MAX_OTHER_REQUEST_BYTES, KEEPER_MAX_RECORD_FDS, KEEPER_MAX_REPLY_BYTES, KEEPER_MAX_REQUEST_BYTES, KEEPER_PROTOCOL_VERSION, KeeperOp,
} from '../../src/keeper/keeperProtocol.js';
import { fromHex, keeperWire } from '../helpers/keeperWireVectors.js';

test('the constants are the vectors\'', () => {
  const c = keeperWire.constants;
  assert.equal(
    {
      magic: KEEPER_MAGIC.toString('latin1'), protocolVersion: KEEPER_PROTOCOL_VERSION, headerBytes: KEEPER_HEADER_BYTES, maxRequestBytes: KEEPER_MAX_REQUEST_BYTES,
      maxOtherRequestBytes: KEEPER_MAX_OTHER_REQUEST_BYTES, maxReplyBytes: KEEPER_MAX_REPLY_BYTES, maxRecordFds: KEEPER_MAX_RECORD_FDS,
    },
    { magic: c.magic, protocolVersion: c.protocolVersion, headerBytes: c.headerBytes, maxRequestBytes: c.maxRequestBytes, maxOtherRequestBytes: c.maxOtherRequestBytes, maxReplyBytes: c.maxReplyBytes, maxRecordFds: c.maxRecordFds },
  );
  assert.equal(Object.fromEntries(Object.entries(KeeperOp).map(([op, n]) => [op.toUpperCase(), n])), keeperWire.ops);
});

const encoders = {
  KEEP: (v: { device?: string; fingerprint?: string; record?: string }) => encodeKeep(v.device!, v.fingerprint!, fromHex(v.record!)),
  TAKE: (v: { device?: string; fingerprint?: string }) => encodeTake(v.device!, v.fingerprint!),
  DROP: (v: { device?: string; fingerprint?: string }) => encodeDrop(v.device!, v.fingerprint!),
  LIST: () => encodeList(),
  PING: () => encodePing(),
  WATCH: () => encodeWatch(),
};

for (const v of keeperWire.requests) {
  test(`encodes ${v.op}: ${v.why}`, () => {
    assert.is(encoders[v.op](v).toString('hex'), fromHex(v.frame).toString('hex'));
  });
}

test("keepPayloadBytes is each KEEP vector's payload length, and the frame's past the header for multi-byte UTF-8 too", () => {
  for (const v of keeperWire.requests.filter((r) => r.op === 'KEEP')) {
    assert.is(keepPayloadBytes(v.device!, v.fingerprint!, fromHex(v.record!)), fromHex(v.frame).length - KEEPER_HEADER_BYTES, v.why);
  }
  const record = Buffer.alloc(1000);
  assert.is(keepPayloadBytes('gpu-é', 'fp-ü', record), encodeKeep('gpu-é', 'fp-ü', record).length - KEEPER_HEADER_BYTES);
});

test('a request payload of exactly the limit is sent, one byte more is refused (E_FRAME_TOO_LARGE)', () => {
  // KEEP's payload: op, two empty strings, the blob's length, the blob.
  const fixed = 1 + 2 + 2 + 4;
  assert.is(encodeKeep('', '', Buffer.alloc(keeperWire.constants.maxRequestBytes - fixed)).length, keeperWire.constants.headerBytes + keeperWire.constants.maxRequestBytes);
  try {
    encodeKeep('', '', Buffer.alloc(keeperWire.constants.maxRequestBytes - fixed + 1));
    assert.unreachable('a payload over the limit was encoded');
  } catch (err) {
    assert.instance(err, ProtocolError);
    assert.is((err as ProtocolError).code, 'E_FRAME_TOO_LARGE');
  }
});

test('a string of more than 65535 bytes of UTF-8 is refused before sending', () => {
  assert.throws(() => encodeTake('é'.repeat(32768), 'fp'), (err: unknown) => err instanceof ProtocolError && err.code === 'E_BAD_REQUEST' && /65536 bytes/.test(err.message));
});

/** What a reply decodes to, as the vectors write it (records as hex). */
function decode(op: string, frame: Buffer): unknown {
  switch (op) {
    case 'KEEP':
      return decodeEmpty(frame) ?? null;
    case 'TAKE': {
      const t = decodeTake(frame);
      return { record: t.record.toString('hex'), ageMs: t.ageMs };
    }
    case 'DROP':
      return decodeDrop(frame);
    case 'LIST':
      return decodeList(frame).map((r) => ({ ...r, record: r.record.toString('hex') }));
    case 'PING':
      return decodePing(frame);
    default:
      throw new Error(`no decoder for a ${op} reply`);
  }
}

for (const v of keeperWire.replies) {
  test(`decodes a ${v.op} reply: ${v.why}`, () => {
    if (!v.error) {
      assert.equal(decode(v.op, fromHex(v.frame)), v.decoded);
      return;
    }
    try {
      decode(v.op, fromHex(v.frame));
      assert.unreachable('an error reply decoded');
    } catch (err) {
      assert.instance(err, KeeperError);
      assert.is((err as KeeperError).code, v.error.code);
      assert.is((err as KeeperError).message, `keeper: ${v.error.message}`);
    }
  });
}

for (const v of keeperWire.badReplies) {
  test(`refuses a ${v.op} reply: ${v.why} (E_KEEPER_REPLY)`, () => {
    assert.throws(() => decode(v.op, fromHex(v.frame)), (err: unknown) => err instanceof ProtocolError && err.code === 'E_KEEPER_REPLY');
  });
}

test.run();
