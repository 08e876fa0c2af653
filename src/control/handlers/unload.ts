// unload: a model by name or fingerprint; drained, or freed at once with force.
import type { ControlReply, ControlRequestOf } from '../controlProtocol.js';
import type { ControlTarget } from '../controlTarget.js';

export async function unload(req: ControlRequestOf<'unload'>, target: ControlTarget): Promise<ControlReply> {
  return { ok: true, ...(await target.unload(req.target, { force: req.force })) };
}
