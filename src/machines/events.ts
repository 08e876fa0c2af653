// Events the supervisor machine receives. UPPER_SNAKE, each with the local rank it concerns.
import type { RankEvent } from '../models/rankContract.js';
import type { GroupEvent } from '../rendezvous/groupEvents.js';
import type { ServeEvent } from '../serve/serveEvents.js';
import type { ModelEvent, ModelRequestEvent } from '../models/modelHost.js';

/** The node's keeper answers again after it was lost or absent: every rank hands it its segments again (src/keeper/keeperLink.ts). */
export type KeeperEvent = { type: 'KEEPER_BACK' };

export type SupervisorEvent = RankEvent | ServeEvent | GroupEvent | ModelEvent | ModelRequestEvent | KeeperEvent | { type: 'STOP'; reason?: string };
