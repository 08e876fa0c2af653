// One connection on the control socket: one bounded request, which must arrive whole within the
// read deadline from the moment of connecting, answered in one frame, then closed. Unlike a
// device socket's ClientConnection (src/serve/clientConnection.ts) nothing stays open after the
// reply: no ids, no pipelining, no idle time. A connection never outstays its business: one that
// sends no complete request in time is told so and closed (src/wire/turnAway.ts: at most
// REFUSAL_GRACE_MS later, so that a peer whose request crosses the refusal still reads it), and
// one that does not take its reply is closed (its descriptor too).
import type { Socket } from 'node:net';
import { asWeightdError, ProtocolError } from '../errors.js';
import { encodeFrame, FrameDecoder } from '../wire/frameCodec.js';
import { turnAway } from '../wire/turnAway.js';
import type { ControlReply } from './controlProtocol.js';
import { MAX_CONTROL_REQUEST_BYTES } from './controlSocket.js';

export class ControlConnection {
  readonly #socket: Socket;
  readonly #readTimeoutMs: number;

  /** `serve` answers the request's payload; `closed` runs once the socket is gone. */
  constructor(socket: Socket, readTimeoutMs: number, serve: (payload: Buffer) => Promise<ControlReply>, closed: () => void) {
    this.#socket = socket;
    this.#readTimeoutMs = readTimeoutMs;
    socket.on('close', () => {
      clearTimeout(timer);
      closed();
    });
    const timer = setTimeout(() => {
      // What the peer sends from now on is drained unread: too late to be served.
      socket.off('data', onData);
      turnAway(socket, encodeFrame(JSON.stringify(refusal(new ProtocolError('E_READ_TIMEOUT', `no complete control request within ${readTimeoutMs} ms`)))));
    }, readTimeoutMs);
    const decoder = new FrameDecoder(MAX_CONTROL_REQUEST_BYTES);
    const onData = (chunk: Buffer) => {
      let frames: Buffer[];
      try {
        frames = decoder.push(chunk);
      } catch (err) {
        socket.off('data', onData);
        clearTimeout(timer);
        this.#reply(refusal(err));
        return;
      }
      if (frames.length === 0) return;
      socket.off('data', onData);
      clearTimeout(timer);
      void serve(frames[0]!).then((reply) => this.#reply(reply));
    };
    socket.on('data', onData);
  }

  destroy(): void {
    this.#socket.destroy();
  }

  /**
   * The connection's one reply. The socket is closed once it is written (end() alone would wait
   * for the peer to close its side too), or when the peer reads none of it for as long as a
   * request may take to arrive.
   */
  #reply(reply: ControlReply): void {
    const socket = this.#socket;
    if (socket.destroyed) return;
    socket.setTimeout(this.#readTimeoutMs, () => socket.destroy());
    socket.end(encodeFrame(JSON.stringify(reply)), () => socket.destroy());
  }
}

/** A refused request's reply frame. */
export function refusal(err: unknown): ControlReply {
  const e = asWeightdError(err);
  return { ok: false, error: { code: e.code, message: e.message, ...(Object.keys(e.details).length > 0 ? { details: e.details } : {}) } };
}
