// A reply that carries descriptors: its JSON goes in one frame, and `fds` ride with it as
// SCM_RIGHTS (clientConnection.ts writes it once the socket's queue is empty, in reply order).
// The fds stay the sender's; `sent` runs once the send has settled, whatever its outcome, or
// when the connection closed before it could start.
export interface FdReply {
  json: string;
  fds: number[];
  sent: () => void;
}

/**
 * A reply already encoded: its UTF-8 JSON is these bytes, one after another (get_state's cached
 * manifest); `trailer`, the payload of a frame written right after it, with nothing between
 * (get_state's packed manifest, docs/spec/manifest-packed.md).
 */
export interface EncodedReply {
  pieces: readonly Buffer[];
  trailer?: Buffer;
}

/** What a handler answers: serialized JSON, encoded JSON, or JSON with descriptors. */
export type Reply = string | EncodedReply | FdReply;
