// A device server serving one rank, as the node serves a model of one version: what the serving
// tests drive (the node itself goes through src/serve/serverRegistry.ts).
import type { Logger } from '../../src/log.js';
import { DeviceServer } from '../../src/serve/deviceServer.js';
import { RankService, type RankServiceOptions } from '../../src/serve/rankService.js';
import type { ServedRankData } from '../../src/serve/servedRankData.js';
import type { ServeLimits } from '../../src/serve/serveLimits.js';

export interface OneRankServer extends DeviceServer {
  readonly service: RankService;
  readonly status: RankService['status'];
  stats(): ReturnType<DeviceServer['stats']>;
}

export function oneRankServer(o: { rank: ServedRankData; socketDir?: string; log: Logger; freeMemory: () => Promise<void>; limits?: Partial<ServeLimits>; onStale?: RankServiceOptions['onStale'] }): OneRankServer {
  const server = new DeviceServer({ deviceUuid: o.rank.device.uuid, socketDir: o.socketDir, log: o.log, limits: o.limits });
  const service = new RankService({ rank: o.rank, log: o.log, freeMemory: o.freeMemory, onStale: o.onStale });
  server.add(service);
  const stats = server.stats.bind(server);
  return Object.defineProperties(server, {
    service: { value: service },
    status: { get: () => service.status },
    stats: { value: () => stats(service) },
  }) as unknown as OneRankServer;
}
