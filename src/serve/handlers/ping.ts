// ping: who serves on this socket, and whether get_state can succeed now. Takes no lease.
import { PROTOCOL_VERSION, type PingReply, type RequestOf } from '../protocol.js';
import type { RankService } from '../rankService.js';

export function ping(req: RequestOf<'ping'>, service: RankService): string {
  const r = service.rank;
  const reply: PingReply = {
    id: req.id,
    ok: true,
    status: service.status,
    protocolVersion: PROTOCOL_VERSION,
    daemonPid: process.pid,
    model: r.model,
    architecture: r.architecture,
    fingerprint: r.fingerprint,
    layouts: service.layouts,
    device: service.deviceRef,
    rank: service.rankRef,
  };
  return JSON.stringify(reply);
}
