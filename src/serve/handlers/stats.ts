// stats: the rank's counters and live leases (by hash: an id would let the reader detach it).
import type { RequestOf, StatsReply } from '../protocol.js';
import type { RankService } from '../rankService.js';

export function stats(req: RequestOf<'stats'>, service: RankService): string {
  service.expireDeadLeases();
  const s = service.stats();
  const reply: StatsReply = {
    id: req.id,
    ok: true,
    status: s.status,
    connections: s.connections,
    leases: service.leases.list(),
    requests: s.requests,
    protocolErrors: s.protocolErrors,
    refusedPeers: s.refusedPeers,
    uptimeSeconds: (Date.now() - service.startedAt) / 1000,
    // What an engine subtracts from its own memory budget on this device (vLLM's KV cache).
    deviceBytes: s.status === 'released' ? 0 : service.rank.segments.reduce((n, seg) => n + seg.bytes, 0),
  };
  return JSON.stringify(reply);
}
