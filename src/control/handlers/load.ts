// load: a model beside those resident, under this request's eviction policy or the daemon's.
import type { ControlReply, ControlRequestOf } from '../controlProtocol.js';
import type { ControlTarget } from '../controlTarget.js';

export async function load(req: ControlRequestOf<'load'>, target: ControlTarget): Promise<ControlReply> {
  const { cmd: _cmd, evict, ...request } = req;
  return { ok: true, ...(await target.load(request, { evict })) };
}
