// detach: a client is done with the memory; ends the lease it names, or every lease its
// connection took.
import type { Caller } from '../leaseTable.js';
import type { DetachReply, RequestOf } from '../protocol.js';
import type { RankService } from '../rankService.js';

export function detach(req: RequestOf<'detach'>, service: RankService, caller: Caller): string {
  const dropped = service.leases.detach(caller, req.leaseId);
  for (const l of dropped) service.logLease(l, 'lease detached');
  const reply: DetachReply = { id: req.id, ok: true, dropped: dropped.length };
  return JSON.stringify(reply);
}
