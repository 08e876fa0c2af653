// The wire framing of the serving protocol (docs/protocol.md), shared by the server and the
// TypeScript client. A frame is a 10-byte header, then a UTF-8 JSON payload:
//   0..3  magic "WGTD"   4..5  frame version, u16 big-endian   6..9  payload length, u32 big-endian
// The decoder rejects a frame as soon as its header shows it is bad (wrong magic, unknown
// version, length over the bound), before buffering the body, so a hostile length costs nothing.
import { ProtocolError } from '../errors.js';
import { describeJsonError, parseBoundedJson } from '../files/parseBoundedJson.js';

export const FRAME_MAGIC = Buffer.from('WGTD', 'latin1');
export const FRAME_VERSION = 1;
export const FRAME_HEADER_BYTES = 10;
/** Largest request a server accepts: requests are small commands, never bulk data. */
export const MAX_REQUEST_BYTES = 1 << 20;
/** Largest response a client accepts: a manifest of ~100k tensors is tens of MiB. */
export const MAX_RESPONSE_BYTES = 256 << 20;

/** The header of a frame whose payload is `payloadBytes` long, written at `into`'s start. */
function writeHeader(into: Buffer, payloadBytes: number): Buffer {
  FRAME_MAGIC.copy(into, 0);
  into.writeUInt16BE(FRAME_VERSION, 4);
  into.writeUInt32BE(payloadBytes, 6);
  return into;
}

/** One frame around an already-serialized JSON payload. */
export function encodeFrame(json: string): Buffer {
  const body = Buffer.from(json, 'utf8');
  const frame = writeHeader(Buffer.allocUnsafe(FRAME_HEADER_BYTES + body.length), body.length);
  body.copy(frame, FRAME_HEADER_BYTES);
  return frame;
}

/** One frame around a payload already encoded in pieces, as buffers to write in order: none is copied. */
export function framePieces(pieces: readonly Buffer[]): Buffer[] {
  let length = 0;
  for (const p of pieces) length += p.length;
  return [writeHeader(Buffer.allocUnsafe(FRAME_HEADER_BYTES), length), ...pieces];
}

export function encodeMessage(message: unknown): Buffer {
  return encodeFrame(JSON.stringify(message));
}

// fatal: a payload that is not UTF-8 is refused, not silently repaired with U+FFFD (a repaired
// string could pass the schema while meaning something the sender did not send).
const utf8 = new TextDecoder('utf-8', { fatal: true });

/** How much of a peer's bad frame is searched for where it stops being JSON (describeJsonError). */
const LOCATE_UP_TO = 64 << 10;

/**
 * Parses a payload into a value; a payload that is not UTF-8 JSON is the sender's protocol error.
 * `parse` bounds the nesting by default (frames from clients and rendezvous peers).
 */
export function parsePayload(payload: Buffer, parse: (text: string) => unknown = (text) => parseBoundedJson(text, LOCATE_UP_TO)): unknown {
  let text: string;
  try {
    text = utf8.decode(payload);
  } catch {
    throw new ProtocolError('E_FRAME_JSON', `frame payload of ${payload.length} bytes is not valid UTF-8`);
  }
  try {
    // Nesting is bounded before parsing: a 4 MiB frame of brackets cost JSON.parse 2 s of the
    // main thread, which serves every client and the rendezvous.
    return parse(text);
  } catch (err) {
    throw new ProtocolError('E_FRAME_JSON', `frame payload of ${payload.length} bytes is not valid JSON: ${describeJsonError(text, err, LOCATE_UP_TO)}`);
  }
}

/**
 * Incremental decoder for one byte stream. `push` returns every payload completed by the
 * chunk. A bad header makes the stream unusable: `push` throws its ProtocolError, unless
 * complete frames came before it in the same chunk; those are returned first, as if they had
 * arrived in a read of their own, and the error is then in `failure` (and thrown by the next
 * `push`).
 */
export class FrameDecoder {
  readonly #maxPayload: number;
  #chunks: Buffer[] = [];
  #buffered = 0;
  /** Payload length of the frame being read, once its header is complete. */
  #expected = -1;
  #failure: ProtocolError | undefined;

  constructor(maxPayloadBytes: number) {
    this.#maxPayload = maxPayloadBytes;
  }

  /** Bytes of an unfinished frame held: non-zero means a frame is partway read. */
  get buffered(): number {
    return this.#buffered;
  }

  /** The error that ended the stream after the frames `push` last returned. */
  get failure(): ProtocolError | undefined {
    return this.#failure;
  }

  push(chunk: Buffer): Buffer[] {
    if (this.#failure) throw this.#failure;
    this.#chunks.push(chunk);
    this.#buffered += chunk.length;
    const out: Buffer[] = [];
    try {
      this.#decode(out);
    } catch (err) {
      if (!(err instanceof ProtocolError) || out.length === 0) throw err;
      this.#failure = err;
    }
    return out;
  }

  #decode(out: Buffer[]): void {
    for (;;) {
      if (this.#expected < 0) {
        this.#checkMagic();
        if (this.#buffered < FRAME_HEADER_BYTES) return;
        const header = this.#peek(FRAME_HEADER_BYTES);
        const version = header.readUInt16BE(4);
        if (version !== FRAME_VERSION) {
          throw new ProtocolError('E_FRAME_VERSION', `frame version ${version} is not supported (this side speaks ${FRAME_VERSION}); upgrade the older of client and daemon`, { version });
        }
        const length = header.readUInt32BE(6);
        if (length > this.#maxPayload) {
          throw new ProtocolError('E_FRAME_TOO_LARGE', `frame of ${length} bytes exceeds the limit of ${this.#maxPayload} bytes`, { length, limit: this.#maxPayload });
        }
        this.#expected = length;
      }
      if (this.#buffered < FRAME_HEADER_BYTES + this.#expected) return;
      const frame = this.#take(FRAME_HEADER_BYTES + this.#expected);
      out.push(frame.subarray(FRAME_HEADER_BYTES));
      this.#expected = -1;
    }
  }

  /** Fails on the first byte that departs from the magic, even before 4 bytes arrived. */
  #checkMagic(): void {
    const n = Math.min(this.#buffered, FRAME_MAGIC.length);
    if (n === 0) return;
    const head = this.#peek(n);
    if (!head.equals(FRAME_MAGIC.subarray(0, n))) {
      throw new ProtocolError('E_FRAME_MAGIC', `frame does not start with the magic "WGTD" (got 0x${head.toString('hex')}); the peer does not speak the weightd protocol`);
    }
  }

  /** The first n buffered bytes, without consuming them (copies only when they span chunks). */
  #peek(n: number): Buffer {
    if (this.#chunks[0]!.length < n) this.#chunks = [Buffer.concat(this.#chunks)];
    return this.#chunks[0]!.subarray(0, n);
  }

  /** Consumes n bytes. Large frames are joined once, when complete, not on every chunk. */
  #take(n: number): Buffer {
    const all = this.#chunks.length === 1 ? this.#chunks[0]! : Buffer.concat(this.#chunks);
    const rest = all.subarray(n);
    this.#chunks = rest.length > 0 ? [rest] : [];
    this.#buffered -= n;
    return all.subarray(0, n);
  }
}
