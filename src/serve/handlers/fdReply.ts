// A reply that carries descriptors: its JSON goes in one frame, and `fds` ride with it as
// SCM_RIGHTS (clientConnection.ts writes it once the socket's queue is empty, in reply order).
// The fds stay the sender's; `sent` runs once the send has settled, whatever its outcome, or
// when the connection closed before it could start.
export interface FdReply {
  json: string;
  fds: number[];
  sent: () => void;
}

/** What a handler answers: serialized JSON, or JSON with descriptors. */
export type Reply = string | FdReply;
