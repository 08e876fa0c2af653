// detach: a client is done with the memory; ends the lease it names, or every lease its
// connection took, of every model version on the socket. A draining version whose last lease
// this was is freed now.
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { DetachReply, RequestOf } from '../../wire/protocol.js';

export function detach(req: RequestOf<'detach'>, services: DeviceServices, caller: Caller): string {
  let dropped = 0;
  for (const service of [...services.all]) {
    const ended = service.leases.detach(caller, req.leaseId);
    for (const l of ended) service.logLease(l, 'lease detached');
    dropped += ended.length;
    if (ended.length > 0) service.leasesEnded();
  }
  const reply: DetachReply = { id: req.id, ok: true, dropped };
  return JSON.stringify(reply);
}
