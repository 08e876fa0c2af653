// The dispatch table: one handler per command of the protocol (protocol.ts COMMANDS), each in
// its own file and given the rank service and the caller. The table's type makes a command
// without a handler, or a handler of the wrong request, a compile error.
import type { Caller } from '../leaseTable.js';
import type { Command, Request, RequestOf } from '../protocol.js';
import type { RankService } from '../rankService.js';
import { detach } from './detach.js';
import type { Reply } from './fdReply.js';
import { getSegmentFds } from './getSegmentFds.js';
import { getState } from './getState.js';
import { ping } from './ping.js';
import { release } from './release.js';
import { stats } from './stats.js';

/** Serves one valid request; returns the serialized reply (with descriptors, for some). Throws WeightdError to refuse it. */
type Handler<C extends Command> = (req: RequestOf<C>, service: RankService, caller: Caller) => Reply | Promise<Reply>;

const handlers: { [C in Command]: Handler<C> } = { ping, get_state: getState, get_segment_fds: getSegmentFds, release, detach, stats };

export async function dispatch(req: Request, service: RankService, caller: Caller): Promise<Reply> {
  const handler = handlers[req.cmd] as Handler<typeof req.cmd>;
  return handler(req, service, caller);
}
