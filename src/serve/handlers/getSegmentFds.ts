// get_segment_fds: the descriptors of the segments (all, or those the request names) of the model version a lease is of (sealed memfds or cuda-fd), for the holder of a
// live lease, sent with the reply as SCM_RIGHTS. The lease is the one get_state granted: asked on
// the same connection (Python) or another of the same process (TypeScript, which uses a
// connection of its own for descriptors); leaseTable.ts's namedBy says who may name it.
import { ServeError } from '../../errors.js';
import type { Caller } from '../leaseTable.js';
import { leaseHash } from '../leaseTable.js';
import type { GetSegmentFdsReply, RequestOf } from '../../wire/protocol.js';
import type { DeviceServices } from '../deviceServices.js';
import type { FdReply } from './fdReply.js';
import { versionFor } from './modelVersions.js';

export async function getSegmentFds(req: RequestOf<'get_segment_fds'>, services: DeviceServices, caller: Caller): Promise<FdReply> {
  const service = services.byLease(caller, req.leaseId);
  if (!service) {
    // A released version's leases are gone with it: say that, rather than that the lease is.
    const fallback = versionFor(services, undefined);
    fallback.refuseIfFreed();
    throw new ServeError(
      'E_NO_LEASE',
      `lease ${leaseHash(req.leaseId)} (hash) is not a live lease of this client on rank ${fallback.rank.globalRank}; it was detached, ended with its connection or process, or revoked: ask get_state for a new one`,
    );
  }
  // Adopted descriptors not yet checked (a cuda restart's fast path) are given to no one: this
  // waits for the check, at most as long as it takes, and a failed one refuses by its name.
  await service.untilDescriptorsChecked();
  // A draining version still hands its descriptors to the leases it granted.
  service.refuseIfFreed();
  const fds = service.segmentFds();
  if (fds === undefined) {
    throw new ServeError('E_NO_FDS', `rank ${service.rank.globalRank}'s segments are CUDA IPC handles; use get_state's handles`);
  }
  const all = service.rank.segments.map((s) => s.segment);
  const asked = req.segments ?? all;
  const unknown = asked.filter((n) => !all.includes(n));
  if (unknown.length > 0 || new Set(asked).size !== asked.length) {
    throw new ServeError(
      'E_BAD_REQUEST',
      `get_segment_fds asked for segment(s) [${asked.join(', ')}], but rank ${service.rank.globalRank} has segments [${all.join(', ')}]${unknown.length ? ` (no segment ${unknown.join(', ')})` : ' (one asked twice)'}: name each of its segments at most once`,
      { segments: all },
    );
  }
  const reply: GetSegmentFdsReply = { id: req.id, ok: true, segments: asked };
  return { json: JSON.stringify(reply), fds: asked.map((n) => fds[all.indexOf(n)]!), sent: service.holdSegmentFds() };
}
