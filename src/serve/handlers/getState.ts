// get_state: the manifest and segment handles of one layout of the model version whose
// fingerprint the client sends, under a new lease, once its checkpoint files are checked to be
// unchanged (E_STALE otherwise); a mismatch reply naming the fields that differ (from the named
// model's newest version, else the socket's first) when no version has it.
import { isLayoutName, layoutNames } from '../../checkpoint/layouts/layoutRegistry.js';
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import { differingFingerprintFields } from '../../checkpoint/differingFingerprintFields.js';
import type { Caller } from '../leaseTable.js';
import type { ServedRankData } from '../servedRankData.js';
import type { Reply } from './fdReply.js';
import type { MismatchReply, RequestOf } from '../../wire/protocol.js';
import { modelRefs, versionFor } from './modelVersions.js';

export async function getState(req: RequestOf<'get_state'>, services: DeviceServices, caller: Caller): Promise<Reply> {
  const service = services.byFingerprint(req.fingerprint);
  if (!service) {
    const against = (req.model !== undefined ? services.newestServing(req.model) : undefined) ?? versionFor(services, undefined);
    against.refuseIfFreed();
    const rank = against.rank;
    const reply: MismatchReply = {
      id: req.id,
      ok: true,
      status: 'mismatch',
      // A client of the full-content version is compared with the daemon's fields of that version.
      fields: differingFingerprintFields(theirVersion(rank, req.fingerprintFields), req.fingerprintFields),
      fingerprint: rank.fingerprint,
      fingerprintFields: rank.fingerprintFields,
      models: modelRefs(services),
    };
    against.log.info({ peerPid: caller.pid, fields: reply.fields, client: req.client }, 'fingerprint mismatch: the client will load from disk');
    return JSON.stringify(reply);
  }
  const { log } = service;
  // Before the lease, and with nothing awaited after it: a version whose files changed is stale from the check on.
  await service.checkFiles();
  // A connection that closed during the check already had its leases dropped: a lease granted
  // now would reach no one and hold the version until the client process exits.
  if (!services.isConnected(caller.connectionId)) {
    throw new ServeError('E_DISCONNECTED', 'the client closed the connection while its files were checked; no lease was granted');
  }
  service.refuseUnlessServing(services.newestServing(service.name)?.rank.fingerprint);
  const layout = req.layout ?? 'checkpoint';
  const manifest = service.manifest(layout);
  if (manifest === undefined) {
    const served = service.layouts;
    const refused = (service.rank.refusedLayouts as Record<string, { message: string } | undefined> | undefined)?.[layout];
    if (refused) {
      throw new ServeError('E_UNKNOWN_LAYOUT', `layout "${layout}" was asked for (--layouts) but this checkpoint cannot be served under it: ${refused.message}. Load from disk; the daemon serves ${served.join(', ')}`, { layout, layouts: served });
    }
    const fix = isLayoutName(layout) ? `, or restart weightd with --layouts ${[...served, layout].join(',')}` : ` (weightd has the layouts ${layoutNames().join(', ')})`;
    throw new ServeError('E_UNKNOWN_LAYOUT', `layout "${layout}" is not served by this daemon, which planned ${served.join(', ')}; ask for one of those${fix}`, { layout, layouts: served });
  }
  const lease = service.leases.grant(caller, req.mode);
  if (req.pid !== caller.pid && caller.pid > 0) {
    log.debug({ claimedPid: req.pid, peerPid: caller.pid }, 'client pid differs from SO_PEERCRED (pid namespace?): the lease uses the kernel pid');
  }
  service.logLease(lease, 'lease granted', req.client);
  // The manifest goes out as the bytes encoded once, after this reply's own fields.
  const head = { id: req.id, ok: true, status: 'ok', mode: req.mode, leaseId: lease.id };
  const content = req.digests === true ? manifest.content() : undefined;
  const { fields, trailer } = manifest.encoded(req.packed === true ? 'packed' : req.columns === true ? 'columns' : 'objects');
  return { pieces: [Buffer.from(`${JSON.stringify(head).slice(0, -1)},`, 'utf8'), ...(content ? [content] : []), fields], ...(trailer ? { trailer } : {}) };
}

function theirVersion(rank: ServedRankData, theirs: Record<string, string> | undefined): Record<string, string> {
  return rank.full && theirs?.protocol === rank.full.fingerprintFields.protocol ? rank.full.fingerprintFields : rank.fingerprintFields;
}
