// get_processed: the processed layout `key` of a served version (processedLayouts.ts), under a map
// lease on that version, its sealed segments sent with the reply as SCM_RIGHTS; or, when that key
// is not published, the keys that are, so the engine can say which part of its key differed.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { GetProcessedReply, RequestOf } from '../../wire/protocol.js';
import type { FdReply } from './fdReply.js';
import { modelRefs } from './modelVersions.js';
import { segmentRefs } from '../processedLayouts.js';

export function getProcessed(req: RequestOf<'get_processed'>, services: DeviceServices, caller: Caller): FdReply | string {
  const service = services.byFingerprint(req.fingerprint);
  if (!service) {
    throw new ServeError('E_UNKNOWN_MODEL', `no version with rank fingerprint ${req.fingerprint.slice(0, 64)} is served on this device, so it has no processed layout; ask for one of the versions it serves`, {
      fingerprint: req.fingerprint,
      models: modelRefs(services),
    });
  }
  service.refuseUnlessServing(services.newestServing(service.name)?.rank.fingerprint);
  const layout = service.processed.get(req.key);
  if (!layout) {
    const reply: GetProcessedReply = { id: req.id, ok: true, status: 'absent', fingerprint: service.rank.fingerprint, key: req.key, published: service.processed.list() };
    return JSON.stringify(reply);
  }
  // The lease holds the version, and with it the layout, while the engine maps it.
  const lease = service.leases.grant(caller, 'map', layout.key);
  layout.lastMappedAt = lease.sinceMs;
  service.logLease(lease, `lease granted for processed layout ${req.key}`);
  const reply: GetProcessedReply = {
    id: req.id,
    ok: true,
    status: 'found',
    leaseId: lease.id,
    fingerprint: service.rank.fingerprint,
    key: layout.key,
    backend: service.rank.backend,
    device: service.deviceRef,
    segments: segmentRefs(layout),
    tensors: layout.tensors,
  };
  return { json: JSON.stringify(reply), fds: layout.segments.map((s) => s.fd), sent: service.holdSegmentFds() };
}
