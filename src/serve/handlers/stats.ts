// stats: a model version's counters and live leases (by hash: an id would let the reader detach
// it), with the socket's own counters.
import type { DeviceServices } from '../deviceServices.js';
import type { RequestOf, StatsReply } from '../../wire/protocol.js';
import { versionFor } from './modelVersions.js';

export function stats(req: RequestOf<'stats'>, services: DeviceServices): string {
  const service = versionFor(services, req.fingerprint);
  service.expireDeadLeases();
  const reply: StatsReply = {
    id: req.id,
    ok: true,
    status: service.status,
    connections: services.connectionCount,
    leases: service.leases.list(),
    requests: services.counters.requests,
    protocolErrors: services.counters.protocolErrors,
    refusedPeers: services.counters.refusedPeers,
    uptimeSeconds: (Date.now() - services.startedAt) / 1000,
    // What an engine subtracts from its own memory budget on this device (vLLM's KV cache).
    deviceBytes: service.status === 'released' ? 0 : service.rank.segments.reduce((n, seg) => n + seg.bytes, 0),
    processed: service.processedStatus(),
    heldBytes: heldBytes(services),
  };
  return JSON.stringify(reply);
}

/**
 * Everything the daemon holds on this socket's device: every version of every model that is not
 * released, each memory once (a written version shares the base's segments: SegmentExport.memory),
 * and every processed layout beside them. What an engine sharing the device subtracts from its
 * own budget; deviceBytes is one version's only.
 */
function heldBytes(services: DeviceServices): number {
  const seen = new Set<unknown>();
  let bytes = 0;
  for (const s of services.all) {
    if (s.status === 'released') continue;
    for (const seg of s.rank.segments) {
      const memory = seg.memory ?? seg;
      if (seen.has(memory)) continue;
      seen.add(memory);
      bytes += seg.bytes;
    }
    for (const p of s.processedStatus()) bytes += p.bytes;
  }
  return bytes;
}
