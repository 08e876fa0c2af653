// begin_update: writable copies of a served version's segments on this rank (memfds, or staging
// VMM allocations on cuda), for a writer of the daemon's user (docs/weight-updates.md); they come
// with the reply as SCM_RIGHTS, with the tensors that lie in them. The update desk (updateDesk.ts) owns them from here on.
// With source "pull" (cuda) none come: the writer names its own tensors' memory (pull_tensors, cudaPull.ts).
import { pieceOfWhole } from '../../checkpoint/shardTensor.js';
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { BeginUpdateReply, RequestOf } from '../../wire/protocol.js';
import type { FdReply } from './fdReply.js';
import { modelRefs } from './modelVersions.js';

export async function beginUpdate(req: RequestOf<'begin_update'>, services: DeviceServices, caller: Caller): Promise<FdReply> {
  const service = services.byFingerprint(req.base);
  if (!service || service.name !== req.model) {
    const served = services.all.filter((s) => s.name === req.model && s.status === 'serving').map((s) => s.rank.fingerprint);
    throw new ServeError(
      'E_UPDATE_BASE',
      `no version of model "${req.model}" with rank fingerprint ${req.base.slice(0, 64)} is served on this device; ` +
        (served.length > 0 ? `it serves ${served.join(', ')}: begin from one of those` : `this device serves no version of "${req.model}": load it first (weightd ctl load)`),
      { model: req.model, base: req.base, models: modelRefs(services) },
    );
  }
  const host = services.updates;
  const version = host?.versionOf(service);
  if (!host || !version) {
    throw new ServeError('E_UPDATE_UNSUPPORTED', `this socket serves model "${req.model}" without a node to publish a new version through; updates need a weightd node`, { model: req.model });
  }
  // Adopted descriptors not yet checked (a cuda restart's fast path) are no base to write from:
  // a copy of them, or a version sharing them, would serve bytes no check vouched for. This
  // waits for the check, and a failed one refuses by its name (E_ADOPT_CHECK_FAILED).
  await service.untilDescriptorsChecked();
  service.refuseIfFreed();
  if (req.prepare && req.source !== 'pull') {
    throw new ServeError('E_BAD_REQUEST', `begin_update's prepare is for source "pull" (its finals made before the tensors are named); a staging update copies its segments at begin anyway: drop prepare`, { model: req.model });
  }
  const pull = req.source === 'pull' ? { device: req.device, prepare: req.prepare === true } : undefined;
  const { rank } = service;
  const named = req.tensors ? new Set(req.tensors) : undefined;
  // Made before the desk takes the update: once it has, a throw here would leave its copies held
  // by a reply that never goes (their `sent` unsettled).
  const tensors = rank.tensors
    .filter((t) => !named || named.has(t.name))
    .map((t) => {
      const piece = pieceOfWhole(t, rank.tpSize, rank.globalRank);
      return { name: t.name, dtype: t.dtype, shape: t.shape, segment: t.segment, offset: t.offset, bytes: t.bytes, ...(piece ? { piece } : {}) };
    });
  const { id, fds, segments, sent } = await host.desk.begin(service, version.version, version.ranks, caller, () => services.isConnected(caller.connectionId), req.tensors, pull);
  const reply: BeginUpdateReply = {
    id: req.id,
    ok: true,
    update: id,
    model: rank.name,
    base: rank.fingerprint,
    device: service.deviceRef,
    segments: rank.segments.filter((s) => segments.includes(s.segment)).map((s) => ({ segment: s.segment, bytes: s.bytes, handle: rank.backend === 'cuda' ? 'cuda-fd' : 'fd' })),
    tensors,
  };
  return { json: JSON.stringify(reply), fds, sent };
}
