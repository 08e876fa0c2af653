// pull_tensors: where, in the writer's own GPU memory, the new bytes of some tensors of a pull
// update lie (docs/weight-updates.md, "Pulling from the writer's tensors"); recorded by the update
// desk, copied by commit_update.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { PullTensorsReply, RequestOf } from '../../wire/protocol.js';

export function pullTensors(req: RequestOf<'pull_tensors'>, services: DeviceServices, caller: Caller): string {
  if (!services.updates) throw new ServeError('E_NO_UPDATE', 'this socket takes no updates, so none is in progress on it');
  const { pulled, tensors } = services.updates.desk.pull(req.update, caller, req.sources, req.tensors);
  const reply: PullTensorsReply = { id: req.id, ok: true, pulled, tensors };
  return JSON.stringify(reply);
}
