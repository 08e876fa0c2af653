// One client connection on a rank's socket: framing, validation, deadlines, ordering and
// backpressure. Command semantics live in the handlers (handlers/index.ts). Anything hostile or
// malformed ends this connection only, after a best-effort error frame saying why.
import type { Duplex } from 'node:stream';
import { asWeightdError, ProtocolError, schemaIssues, ServeError, WeightdError } from '../errors.js';
import { encodeFrame, FrameDecoder, framePieces, parsePayload } from '../wire/frameCodec.js';
import { COMMANDS, Request, type ErrorReply } from '../wire/protocol.js';
import type { FdReply, Reply } from './handlers/fdReply.js';
import type { Caller } from './leaseTable.js';
import { socketFdWriter, type FdWriter } from '../wire/socketFdWriter.js';
import { turnAway } from '../wire/turnAway.js';
import { unreadBytes } from '../wire/unreadBytes.js';

export interface ConnectionLimits {
  maxRequestBytes: number;
  /** A frame whose first byte arrived must be complete within this (slowloris). */
  readTimeoutMs: number;
  /** A connection with no request in flight and nothing bound to it is closed after this. */
  idleTimeoutMs: number;
  /**
   * The peer must have read every event (a watch's, lease_revoked) within this of the first one
   * it left unread, or the connection is dropped: a watcher is never idle-closed, so one that
   * stopped reading would otherwise hold its slot, and its events, for ever.
   */
  eventReadTimeoutMs: number;
}

/**
 * The most bytes of frames a connection may have waiting in the daemon's own buffer when an event
 * is written: they are there only once the kernel's buffer for the peer is full (about 200 KiB),
 * so the peer has stopped reading; past this the connection is dropped at once.
 */
export const MAX_EVENT_BACKLOG_BYTES = 256 * 1024;

export interface ConnectionHandler {
  /** Serves one valid request; resolves to the serialized reply, or one with descriptors. May throw WeightdError. */
  handle(request: Request, caller: Caller): Promise<Reply>;
  /** Whether something (a copy-mode lease) needs this connection kept open while it is idle. */
  keepOpen(caller: Caller): boolean;
  /** The connection is gone. */
  closed(caller: Caller): void;
  /** A protocol violation, for the server's (rate-limited) log. */
  violation(caller: Caller, err: WeightdError): void;
}

/** An error frame's payload: `id` null when the daemon has no request to answer (a refusal). */
export function errorReply(id: number | null, err: WeightdError): string {
  const reply: ErrorReply = { id, ok: false, error: { code: err.code, message: err.message } };
  if (Object.keys(err.details).length > 0) reply.error.details = err.details;
  return JSON.stringify(reply);
}

/** The request id of a payload that failed validation, when it has a usable one. */
function idOf(value: unknown): number | null {
  const id = (value as { id?: unknown } | null)?.id;
  return typeof id === 'number' && Number.isSafeInteger(id) && id >= 0 ? id : null;
}

export class ClientConnection {
  readonly caller: Caller;
  readonly #socket: Duplex;
  readonly #handler: ConnectionHandler;
  readonly #limits: ConnectionLimits;
  readonly #decoder: FrameDecoder;
  /** Payloads to serve in order; an error last, when the stream went bad after them. */
  readonly #queue: Array<Buffer | WeightdError> = [];
  #busy = false;
  #closing = false;
  #readTimer: NodeJS.Timeout | undefined;
  #idleTimer: NodeJS.Timeout | undefined;
  readonly #sendFds: FdWriter;
  /** Settles once the last frame written through the stream has reached the kernel. */
  #lastWrite: Promise<void> = Promise.resolve();
  /**
   * Set while a reply with descriptors is being written to the socket's fd, outside the stream;
   * destroy() aborts it, and the send gives up at once.
   */
  #sendAbort: AbortController | undefined;
  /** Event frames that came while a reply with descriptors was being sent: written after it. */
  #heldEvents: Buffer[] = [];
  /** A reply with descriptors is on its way (waiting for the stream to drain, then sendmsg): events wait in #heldEvents. */
  #holdingEvents = false;
  /** When the oldest event the peer may not have read was written (Date.now()); undefined: it read them all. */
  #unreadSince: number | undefined;
  #eventTimer: NodeJS.Timeout | undefined;

  /** `sendFds` writes replies with descriptors; by default on the socket's own fd (socketFdWriter.ts). */
  constructor(socket: Duplex, caller: Caller, handler: ConnectionHandler, limits: ConnectionLimits, sendFds: FdWriter = socketFdWriter(socket)) {
    this.#socket = socket;
    this.caller = caller;
    this.#handler = handler;
    this.#limits = limits;
    this.#sendFds = sendFds;
    this.#decoder = new FrameDecoder(limits.maxRequestBytes);
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    // Errors (a reset by the peer) are followed by 'close', which does the cleanup.
    socket.on('error', () => {});
    socket.on('close', () => {
      this.#closing = true;
      clearTimeout(this.#readTimer);
      clearTimeout(this.#idleTimer);
      clearTimeout(this.#eventTimer);
      this.#handler.closed(caller);
    });
    this.#armIdle();
  }

  /**
   * Writes an event frame (id null: no request asked for it; docs/protocol.md, Events) between
   * replies. Never inside a reply with descriptors, whose bytes go to the fd outside the stream.
   */
  notify(json: string): void {
    if (this.#closing) return;
    const frame = encodeFrame(json);
    const backlog = this.#socket.writableLength + this.#heldEvents.reduce((n, f) => n + f.length, 0) + frame.length;
    if (backlog > MAX_EVENT_BACKLOG_BYTES) {
      this.#fail(null, new ServeError('E_EVENTS_NOT_READ', `${backlog} bytes of replies and events wait for this connection behind its full socket buffer, more than the ${MAX_EVENT_BACKLOG_BYTES} one may leave unread; read events as they come (the client's event listener, poll_events), then connect and watch again`, { backlog, limit: MAX_EVENT_BACKLOG_BYTES }));
      return;
    }
    // Measured before this frame is written: the peer that has read everything so far starts a
    // new clock with it, whatever it left unread (and then read) before.
    if (this.#unreadSince === undefined || unreadBytes(this.#socket) === 0) {
      this.#unreadSince = Date.now();
      this.#armEventRead(this.#limits.eventReadTimeoutMs);
    }
    if (this.#holdingEvents) this.#heldEvents.push(frame);
    else this.#send([frame]);
  }

  destroy(): void {
    this.#closing = true;
    // A reply with descriptors still being sent goes on the addon's duplicate of the socket, never
    // on this number (which the next accepted connection may reuse once closed): the abort closes
    // that duplicate, so the peer sees the end now, not at the reply's deadline.
    this.#sendAbort?.abort();
    this.#socket.destroy();
  }

  #onData(chunk: Buffer): void {
    if (this.#closing) return;
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
    let frames: Buffer[];
    try {
      frames = this.#decoder.push(chunk);
    } catch (err) {
      this.#fail(null, err as WeightdError);
      return;
    }
    const failure = this.#decoder.failure;
    if (this.#decoder.buffered === 0 || failure) {
      clearTimeout(this.#readTimer);
      this.#readTimer = undefined;
    } else if (!this.#readTimer || frames.length > 0) {
      this.#armRead();
    }
    if (frames.length === 0) return;
    // Valid requests that came in the same read as garbage are answered before the error, as
    // if they had come in reads of their own.
    this.#queue.push(...frames, ...(failure ? [failure] : []));
    // One request at a time, in order; reading pauses meanwhile so a client that pipelines
    // faster than it reads replies cannot make us buffer without bound.
    this.#socket.pause();
    if (!this.#busy) void this.#drainQueue();
  }

  async #drainQueue(): Promise<void> {
    this.#busy = true;
    // Reading is paused while requests are served: a partial next frame is not the client's
    // delay, so its read deadline stops here and restarts on resume.
    clearTimeout(this.#readTimer);
    this.#readTimer = undefined;
    while (this.#queue.length > 0 && !this.#closing) {
      const payload = this.#queue.shift()!;
      if (payload instanceof WeightdError) {
        this.#fail(null, payload);
        return;
      }
      let value: unknown;
      try {
        value = parsePayload(payload);
      } catch (err) {
        this.#fail(null, err as WeightdError);
        return;
      }
      const parsed = Request.safeParse(value);
      if (!parsed.success) {
        const cmd = (value as { cmd?: unknown } | null)?.cmd;
        if (typeof cmd === 'string' && !(COMMANDS as readonly string[]).includes(cmd) && idOf(value) !== null) {
          // A well-formed request for a command we do not know: a newer client. Say so and
          // keep the connection, so it can fall back to commands we have.
          await this.#write(errorReply(idOf(value), new ProtocolError('E_UNKNOWN_COMMAND', `unknown command ${JSON.stringify(cmd.slice(0, 40))}; this daemon knows ${COMMANDS.join(', ')}`)));
          continue;
        }
        this.#fail(idOf(value), new ProtocolError('E_BAD_REQUEST', `request does not match the protocol schema: ${schemaIssues(parsed.error.issues)}`));
        return;
      }
      let reply: Reply;
      try {
        reply = await this.#handler.handle(parsed.data, this.caller);
      } catch (err) {
        reply = errorReply(parsed.data.id, asWeightdError(err));
      }
      if (this.#closing) {
        // Descriptors held for a send that will not happen are let go (FdReply.sent).
        if (typeof reply !== 'string' && 'fds' in reply) reply.sent();
        return;
      }
      await this.#write(reply);
    }
    this.#busy = false;
    if (this.#closing) return;
    this.#socket.resume();
    if (this.#decoder.buffered > 0) this.#armRead();
    this.#armIdle();
  }

  #write(reply: Reply): Promise<void> {
    if (typeof reply === 'string') return this.#writeFrame([encodeFrame(reply)]);
    if (!('pieces' in reply)) return this.#writeWithFds(reply);
    // One corked write: no event frame can come between a reply and its trailer.
    return this.#writeFrame([...framePieces(reply.pieces), ...(reply.trailer ? framePieces([reply.trailer]) : [])]);
  }

  /**
   * Writes a reply; waits for the socket to drain so large replies do not pile up. A client
   * that does not take its reply within the idle timeout is cut off: it would otherwise hold
   * the connection (and the reply's memory) forever.
   */
  #writeFrame(buffers: readonly Buffer[]): Promise<void> {
    return new Promise((resolve) => {
      if (this.#closing) return resolve();
      if (this.#send(buffers)) resolve();
      else {
        const deadline = setTimeout(() => this.destroy(), this.#limits.idleTimeoutMs);
        const done = () => {
          clearTimeout(deadline);
          this.#socket.off('drain', done);
          this.#socket.off('close', done);
          resolve();
        };
        this.#socket.on('drain', done);
        this.#socket.on('close', done);
      }
    });
  }

  /**
   * Writes frames to the stream without waiting for them to drain (events: the peer's reading is
   * bounded by notify's rules instead); returns whether the stream took them without buffering.
   */
  #send(buffers: readonly Buffer[]): boolean {
    let written = true;
    this.#lastWrite = new Promise<void>((flushed) => {
      // Corked, the pieces leave in one writev.
      this.#socket.cork();
      buffers.forEach((b, i) => (written = i < buffers.length - 1 ? this.#socket.write(b) : this.#socket.write(b, () => flushed())));
      this.#socket.uncork();
    });
    return written;
  }

  /**
   * Once the peer has had `ms` to read the oldest event it may not have read: it has read
   * everything since (the clock stops), or a newer event restarted the clock, or it is dropped.
   */
  #armEventRead(ms: number): void {
    clearTimeout(this.#eventTimer);
    this.#eventTimer = setTimeout(() => {
      if (this.#closing || this.#unreadSince === undefined) return;
      if (unreadBytes(this.#socket) === 0) {
        this.#unreadSince = undefined;
        return;
      }
      const waited = Date.now() - this.#unreadSince;
      const timeout = this.#limits.eventReadTimeoutMs;
      if (waited < timeout) return this.#armEventRead(timeout - waited);
      this.#fail(null, new ServeError('E_EVENTS_NOT_READ', `this connection left events unread for ${waited} ms, longer than the ${timeout} ms a connection may (WEIGHTD_SERVE_EVENT_READ_TIMEOUT_MS); read events as they come (the client's event listener, poll_events), then connect and watch again`, { waitedMs: waited, limitMs: timeout }));
    }, ms);
  }

  /**
   * Writes a reply with descriptors once every byte written before it has left the stream's
   * queue (the fd is written directly, outside it), within the idle timeout, as #writeFrame's
   * reply. A send that fails may have written part of the frame: the connection ends.
   */
  async #writeWithFds(reply: FdReply): Promise<void> {
    // Events wait from now on, not only while sendmsg runs: one written while the bytes before
    // this reply drain would still be in the stream's queue when the fd is written to directly.
    this.#holdingEvents = true;
    try {
      let deadline: NodeJS.Timeout | undefined;
      const flushed = await Promise.race([
        this.#lastWrite.then(() => true),
        new Promise<boolean>((resolve) => (deadline = setTimeout(() => resolve(false), this.#limits.idleTimeoutMs))),
      ]);
      clearTimeout(deadline);
      if (!flushed) this.destroy();
      if (this.#closing) return;
      this.#sendAbort = new AbortController();
      try {
        await this.#sendFds(encodeFrame(reply.json), reply.fds, this.#limits.idleTimeoutMs, this.#sendAbort.signal);
      } catch (err) {
        // Closed by this side (stop, a violation already reported): the abort is no fault of the peer's.
        if (!this.#closing) this.#handler.violation(this.caller, err instanceof WeightdError ? err : new WeightdError('E_INTERNAL', (err as Error).message));
        this.destroy();
      } finally {
        this.#sendAbort = undefined;
      }
    } finally {
      this.#holdingEvents = false;
      if (!this.#closing && this.#heldEvents.length > 0) this.#send(this.#heldEvents.splice(0));
      reply.sent();
    }
  }

  /**
   * The deadline runs from a frame's first byte and is not extended by later bytes, so a peer
   * that trickles one byte at a time (slowloris) is cut off.
   */
  #armRead(): void {
    clearTimeout(this.#readTimer);
    this.#readTimer = setTimeout(() => {
      this.#fail(null, new ProtocolError('E_READ_TIMEOUT', `request frame not complete within ${this.#limits.readTimeoutMs} ms of its first byte (${this.#decoder.buffered} bytes received)`));
    }, this.#limits.readTimeoutMs);
  }

  #armIdle(): void {
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
    if (this.#busy || this.#closing || this.#handler.keepOpen(this.caller)) return;
    this.#idleTimer = setTimeout(() => this.destroy(), this.#limits.idleTimeoutMs);
  }

  /** Tells the peer why (if it still listens), then closes (src/wire/turnAway.ts). */
  #fail(id: number | null, err: WeightdError): void {
    if (this.#closing) return;
    this.#closing = true;
    this.#handler.violation(this.caller, err);
    clearTimeout(this.#readTimer);
    clearTimeout(this.#idleTimer);
    clearTimeout(this.#eventTimer);
    this.#queue.length = 0;
    // An event's rules can drop the connection while a reply with descriptors is sent outside the
    // stream: a frame written to the stream now could land inside that reply's bytes.
    if (this.#sendAbort) return this.destroy();
    // Ended drained, not destroyed once written: a peer still sending (its request crossed the
    // deadline, or the rest of a refused frame) would get EPIPE and lose this frame unread.
    turnAway(this.#socket, encodeFrame(errorReply(id, err)));
  }
}
