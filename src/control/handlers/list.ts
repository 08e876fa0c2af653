// list: every model version the node holds, with its ranks, bytes and leases.
import type { ControlReply, ControlRequestOf } from '../controlProtocol.js';
import type { ControlTarget } from '../controlTarget.js';

export function list(_req: ControlRequestOf<'list'>, target: ControlTarget): ControlReply {
  return { ok: true, models: target.models() };
}
