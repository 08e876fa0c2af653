// The dispatch table: one handler per command of the protocol (protocol.ts COMMANDS), each in
// its own file and given the device's model versions and the caller. The table's type makes a
// command without a handler, or a handler of the wrong request, a compile error.
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { Command, Request, RequestOf } from '../../wire/protocol.js';
import { beginPublish } from './beginPublish.js';
import { beginUpdate } from './beginUpdate.js';
import { commitPublish } from './commitPublish.js';
import { commitUpdate } from './commitUpdate.js';
import { detach } from './detach.js';
import type { Reply } from './fdReply.js';
import { getProcessed } from './getProcessed.js';
import { getSegmentFds } from './getSegmentFds.js';
import { getState } from './getState.js';
import { openPullPlan } from './openPullPlan.js';
import { ping } from './ping.js';
import { pullByPlan } from './pullByPlan.js';
import { pullTensors } from './pullTensors.js';
import { release } from './release.js';
import { stats } from './stats.js';
import { watch } from './watch.js';

/** Serves one valid request; returns the serialized reply (with descriptors, for some). Throws WeightdError to refuse it. */
type Handler<C extends Command> = (req: RequestOf<C>, services: DeviceServices, caller: Caller) => Reply | Promise<Reply>;

const handlers: { [C in Command]: Handler<C> } = {
  ping, get_state: getState, get_segment_fds: getSegmentFds, release, detach, stats, watch, begin_update: beginUpdate, pull_tensors: pullTensors, open_pull_plan: openPullPlan, pull_by_plan: pullByPlan, commit_update: commitUpdate,
  begin_publish: beginPublish, commit_publish: commitPublish, get_processed: getProcessed,
};

export async function dispatch(req: Request, services: DeviceServices, caller: Caller): Promise<Reply> {
  const handler = handlers[req.cmd] as Handler<typeof req.cmd>;
  return handler(req, services, caller);
}
