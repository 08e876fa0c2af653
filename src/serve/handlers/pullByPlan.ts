// pull_by_plan: a pull update's tensors named by a pull plan this process opened
// (docs/weight-updates.md, "Pull plans"); recorded and copied by the update desk as pull_tensors'.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { PullTensorsReply, RequestOf } from '../../wire/protocol.js';

export function pullByPlan(req: RequestOf<'pull_by_plan'>, services: DeviceServices, caller: Caller): string {
  const host = services.updates;
  if (!host) throw new ServeError('E_NO_UPDATE', 'this socket takes no updates, so none is in progress on it');
  const { pulled, tensors } = host.desk.pullByPlan(req.update, caller, (service) => host.plans.find(req.plan, caller, service));
  const reply: PullTensorsReply = { id: req.id, ok: true, pulled, tensors };
  return JSON.stringify(reply);
}
