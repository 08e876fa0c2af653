// ping: who serves on this socket, and whether get_state can succeed now. Takes no lease.
import type { DeviceServices } from '../deviceServices.js';
import { PROTOCOL_VERSION, type PingReply, type RequestOf } from '../../wire/protocol.js';
import { modelRefs, versionFor } from './modelVersions.js';

export function ping(req: RequestOf<'ping'>, services: DeviceServices): string {
  const service = versionFor(services, req.fingerprint);
  const r = service.rank;
  const reply: PingReply = {
    id: req.id,
    ok: true,
    status: service.status,
    protocolVersion: PROTOCOL_VERSION,
    daemonPid: process.pid,
    model: r.model,
    name: r.name,
    architecture: r.architecture,
    fingerprint: r.fingerprint,
    layouts: service.layouts,
    device: service.deviceRef,
    rank: service.rankRef,
    models: modelRefs(services),
  };
  return JSON.stringify(reply);
}
