// rollback: a retained version of a model becomes current again, with no copy (docs/weight-updates.md).
import type { ControlReply, ControlRequestOf } from '../controlProtocol.js';
import type { ControlTarget } from '../controlTarget.js';

export async function rollback(req: ControlRequestOf<'rollback'>, target: ControlTarget): Promise<ControlReply> {
  return { ok: true, ...(await target.rollback(req.name, req.version)) };
}
