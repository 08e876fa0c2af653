// One rendezvous TCP connection, as both ends use it: frames in and out, every incoming message
// validated, heartbeats both ways, and one close callback with the reason. Anything the peer
// does wrong (bad magic, an oversized frame, invalid JSON or schema, silence past the peer
// timeout) closes this connection only, with a reason that says which.
import type { Socket } from 'node:net';
import { errorCode, ProtocolError } from '../errors.js';
import type { GroupTiming } from './timing.js';
import { createRdzvDecoder, encodeRdzvMessage, type AnyMessage } from './groupMessages.js';

export interface PeerSocketOptions<In> {
  /** Turns one frame's payload into a message; throws ProtocolError for a bad one. */
  parse: (payload: Buffer) => In;
  timing: Pick<GroupTiming, 'heartbeatMs' | 'peerTimeoutMs'>;
  onMessage: (message: In) => void;
  /** Called once, when the connection is gone for any reason; `protocolError` when the peer broke the protocol. */
  onClose: (reason: string, protocolError?: ProtocolError) => void;
}

/** How long a closing connection may take to flush its last frame before it is destroyed. */
const CLOSE_GRACE_MS = 1000;

export class PeerSocket<In> {
  #remote: string | undefined;
  readonly #socket: Socket;
  readonly #opts: PeerSocketOptions<In>;
  readonly #decoder = createRdzvDecoder();
  readonly #beat: NodeJS.Timeout;
  #lastHeard = performance.now();
  #closeReason: string | undefined;
  #protocolError: ProtocolError | undefined;
  #closed = false;

  constructor(socket: Socket, opts: PeerSocketOptions<In>) {
    this.#socket = socket;
    this.#opts = opts;
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    socket.on('error', (err) => this.#setReason(`connection error (${errorCode(err) ?? err.message})`));
    socket.on('end', () => this.#setReason('connection closed by the peer'));
    socket.on('close', () => this.#finish());
    const { heartbeatMs, peerTimeoutMs } = opts.timing;
    // Heartbeats run from the first byte, not only once joined: a peer that stalls during the
    // minutes of loading must fail its group as surely as one that stalls while serving.
    this.#beat = setInterval(() => {
      if (performance.now() - this.#lastHeard > peerTimeoutMs) {
        // Timers run before the poll phase: when this thread itself was stalled, the peer's
        // heartbeats may be waiting unread in the socket. setImmediate runs after the poll
        // phase has read them, so only real silence is judged.
        setImmediate(() => {
          const silentMs = performance.now() - this.#lastHeard;
          if (silentMs > peerTimeoutMs && !this.closed) {
            this.destroy(`no message for ${Math.round(silentMs)} ms (peer timeout ${peerTimeoutMs} ms): the peer is frozen or the network is down`);
          }
        });
        return;
      }
      this.send({ type: 'heartbeat' });
    }, heartbeatMs);
    this.#beat.unref();
  }

  /** address:port of the other end, once known (an outgoing socket learns it on connect). */
  get remote(): string {
    if (this.#remote === undefined && this.#socket.remoteAddress) this.#remote = `${this.#socket.remoteAddress}:${this.#socket.remotePort}`;
    return this.#remote ?? '?';
  }

  get closed(): boolean {
    return this.#closed || this.#closeReason !== undefined;
  }

  /** Resolves once the frame is handed to the kernel (or the connection is gone). */
  send(message: AnyMessage): Promise<void> {
    if (this.closed) return Promise.resolve();
    let frame: Buffer;
    try {
      frame = encodeRdzvMessage(message);
    } catch (err) {
      // Callers do not wait on a send (void): a throw here was an unhandled rejection, which ends
      // the process. A message past the frame bound ends this connection instead, saying why.
      this.destroy(`could not send "${message.type}": ${(err as Error).message}`);
      return Promise.resolve();
    }
    return new Promise((resolve) => this.#socket.write(frame, () => resolve()));
  }

  /** Sends `farewell` (if any), then ends the connection; the peer reads everything first. */
  close(reason: string, farewell?: AnyMessage): void {
    if (this.closed) return;
    if (farewell) {
      try {
        this.#socket.write(encodeRdzvMessage(farewell));
      } catch {
        // Past the frame bound: the connection ends without it.
      }
    }
    this.#setReason(reason);
    this.#socket.end();
    setTimeout(() => this.#socket.destroy(), CLOSE_GRACE_MS).unref();
  }

  /** Drops the connection now, unsent frames included. */
  destroy(reason: string, protocolError?: ProtocolError): void {
    this.#setReason(reason);
    this.#protocolError ??= protocolError;
    this.#socket.destroy();
  }

  #onData(chunk: Buffer): void {
    if (this.closed) return;
    this.#lastHeard = performance.now();
    try {
      for (const payload of this.#decoder.push(chunk)) {
        const message = this.#opts.parse(payload);
        if (this.closed) return;
        this.#opts.onMessage(message);
      }
      // Garbage after complete frames in one chunk: the frames counted, now the garbage does.
      if (this.#decoder.failure) throw this.#decoder.failure;
    } catch (err) {
      const protocolError = err instanceof ProtocolError ? err : new ProtocolError('E_RDZV_PROTOCOL', (err as Error).message);
      this.destroy(`protocol error: ${protocolError.message}`, protocolError);
    }
  }

  #setReason(reason: string): void {
    this.#closeReason ??= reason;
  }

  #finish(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#beat);
    this.#opts.onClose(this.#closeReason ?? 'connection closed', this.#protocolError);
  }
}
