// The frame codec: round trips however the bytes are chunked, and rejects a bad header as soon
// as the offending byte arrives, before any body is buffered.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ProtocolError } from '../../src/errors.js';
import { encodeFrame, encodeMessage, FrameDecoder, FRAME_HEADER_BYTES, parsePayload } from '../../src/wire/frameCodec.js';

function decodeAll(decoder: FrameDecoder, bytes: Buffer, step: number): unknown[] {
  const out: unknown[] = [];
  for (let i = 0; i < bytes.length; i += step) for (const p of decoder.push(bytes.subarray(i, i + step))) out.push(parsePayload(p));
  return out;
}

function codeOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    assert.instance(err, ProtocolError);
    return (err as ProtocolError).code;
  }
  return assert.unreachable('expected a ProtocolError') as never;
}

test('round trip in every chunking, several frames per chunk', () => {
  const messages = [{ id: 1, cmd: 'ping' }, { id: 2, text: 'ünïcødé ✓', nested: [1, [2, { a: null }]] }, {}, { big: 'x'.repeat(100_000) }];
  const stream = Buffer.concat(messages.map(encodeMessage));
  for (const step of [1, 3, 10, 11, 4096, stream.length]) {
    const d = new FrameDecoder(1 << 20);
    assert.equal(decodeAll(d, stream, step), messages, `chunks of ${step}`);
    assert.is(d.buffered, 0);
  }
});

test('header layout: magic, u16 version, u32 length, big-endian', () => {
  const f = encodeFrame('{"a":1}');
  assert.is(f.subarray(0, 4).toString('latin1'), 'WGTD');
  assert.is(f.readUInt16BE(4), 1);
  assert.is(f.readUInt32BE(6), 7);
  assert.is(f.length, FRAME_HEADER_BYTES + 7);
});

test('a wrong magic fails on its first wrong byte', () => {
  assert.is(codeOf(() => new FrameDecoder(100).push(Buffer.from('X'))), 'E_FRAME_MAGIC');
  assert.is(codeOf(() => new FrameDecoder(100).push(Buffer.from('WGTX'))), 'E_FRAME_MAGIC');
  const d = new FrameDecoder(100);
  assert.equal(d.push(Buffer.from('WG')), []);
  assert.is(codeOf(() => d.push(Buffer.from('x'))), 'E_FRAME_MAGIC');
});

test('an unknown version or an oversized length fails at the header', () => {
  const h = Buffer.from(encodeFrame('{}').subarray(0, FRAME_HEADER_BYTES));
  h.writeUInt16BE(2, 4);
  assert.is(codeOf(() => new FrameDecoder(100).push(h)), 'E_FRAME_VERSION');
  const big = Buffer.from(encodeFrame('{}').subarray(0, FRAME_HEADER_BYTES));
  big.writeUInt32BE(101, 6);
  assert.is(codeOf(() => new FrameDecoder(100).push(big)), 'E_FRAME_TOO_LARGE');
  big.writeUInt32BE(100, 6);
  assert.equal(new FrameDecoder(100).push(big), [], 'exactly the limit is fine');
});

test('a payload that is not JSON is a protocol error', () => {
  assert.is(codeOf(() => parsePayload(Buffer.from('{nope'))), 'E_FRAME_JSON');
});

test("a peer's bad frame is located only when short: a long one is refused after one parse, quoting none of it", () => {
  const messageOf = (text: string) => {
    try {
      parsePayload(Buffer.from(text));
    } catch (err) {
      return (err as Error).message;
    }
    return assert.unreachable('parsed') as never;
  };
  assert.match(messageOf('[1,1,x]'), /unexpected character at position 5 \(line 1, column 6\)/);
  // 1 MiB of it: the search of prefixes that finds the character took some twenty parses.
  const long = `[${'1,'.repeat(1 << 19)}x]`;
  const said = messageOf(long);
  assert.match(said, new RegExp(`unexpected character somewhere in its ${long.length} characters \\(not located past 65536\\)`));
  assert.not.match(said, /1,1,/, 'nothing of the text is quoted');
});

test('a payload that is not UTF-8 is E_FRAME_JSON, not silently repaired', () => {
  // "ab" with a lone continuation byte, an overlong "/" and a lone surrogate inside a string.
  for (const bad of [[0x22, 0x61, 0x80, 0x62, 0x22], [0x22, 0xc0, 0xaf, 0x22], [0x22, 0xed, 0xa0, 0x80, 0x22]]) {
    assert.is(codeOf(() => parsePayload(Buffer.from(bad))), 'E_FRAME_JSON', Buffer.from(bad).toString('hex'));
  }
  assert.is(parsePayload(Buffer.from('"ünï ✓"')), 'ünï ✓');
});

test('complete frames before garbage in one chunk are returned; the error comes after them', () => {
  const d = new FrameDecoder(100);
  const chunk = Buffer.concat([encodeMessage({ id: 1 }), encodeMessage({ id: 2 }), Buffer.from('GARBAGE')]);
  assert.equal(d.push(chunk).map((p) => parsePayload(p)), [{ id: 1 }, { id: 2 }]);
  assert.is(d.failure?.code, 'E_FRAME_MAGIC');
  assert.is(codeOf(() => d.push(encodeMessage({ id: 3 }))), 'E_FRAME_MAGIC', 'the stream stays unusable');
  const clean = new FrameDecoder(100);
  clean.push(encodeMessage({ id: 1 }));
  assert.is(clean.failure, undefined);
});

test.run();
