// begin_publish: fresh writable memory on this rank for the processed parameters an engine computed
// from a served version (docs/engines.md, "Publishing what the engine computed"), sent with the
// reply as SCM_RIGHTS with where each tensor lies. The publish desk (publishDesk.ts) owns it from here on.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { BeginPublishReply, RequestOf } from '../../wire/protocol.js';
import type { FdReply } from './fdReply.js';
import { modelRefs } from './modelVersions.js';

export async function beginPublish(req: RequestOf<'begin_publish'>, services: DeviceServices, caller: Caller): Promise<FdReply> {
  const service = services.byFingerprint(req.base);
  if (!service || service.name !== req.model) {
    throw new ServeError(
      'E_UPDATE_BASE',
      `no version of model "${req.model}" with rank fingerprint ${req.base.slice(0, 64)} is served on this device, so nothing can be published beside it; publish beside the version the engine mapped`,
      { model: req.model, base: req.base, models: modelRefs(services) },
    );
  }
  if (!services.updates) {
    throw new ServeError('E_UPDATE_UNSUPPORTED', `this socket serves model "${req.model}" without a node to keep published layouts; publishing needs a weightd node`, { model: req.model });
  }
  const { id, fd, bytes, handle, tensors, sent } = await services.updates.publishes.begin(service, req, caller, () => services.isConnected(caller.connectionId));
  const reply: BeginPublishReply = {
    id: req.id,
    ok: true,
    publish: id,
    model: service.name,
    base: service.rank.fingerprint,
    key: req.key,
    device: service.deviceRef,
    segments: [{ segment: 0, bytes, handle }],
    tensors,
  };
  return { json: JSON.stringify(reply), fds: [fd], sent };
}
