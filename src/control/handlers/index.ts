// The control socket's dispatch table: one handler per command of its schema
// (controlProtocol.ts), each in its own file. The table's type makes a command without a
// handler, or a handler of the wrong request, a compile error; test/control/controlCommands.test.ts
// names the files a new command touches.
import type { ControlCommand, ControlReply, ControlRequest, ControlRequestOf } from '../controlProtocol.js';
import type { ControlTarget } from '../controlTarget.js';
import { list } from './list.js';
import { load } from './load.js';
import { rollback } from './rollback.js';
import { unload } from './unload.js';

/** Serves one valid request; throws WeightdError to refuse it. */
type ControlHandler<C extends ControlCommand> = (req: ControlRequestOf<C>, target: ControlTarget) => ControlReply | Promise<ControlReply>;

export const CONTROL_HANDLERS: { readonly [C in ControlCommand]: ControlHandler<C> } = { load, unload, list, rollback };

export async function dispatchControl(req: ControlRequest, target: ControlTarget): Promise<ControlReply> {
  const handler = CONTROL_HANDLERS[req.cmd] as ControlHandler<typeof req.cmd>;
  return handler(req, target);
}
