// Events the supervisor machine receives. UPPER_SNAKE: its group's, its models', node.load's and node.unload's.
import type { GroupEvent } from '../rendezvous/groupEvents.js';
import type { ModelEvent, ModelRequestEvent } from '../models/modelHost.js';

/** The node's keeper answers again after it was lost or absent: every model's ranks hand it their segments again (src/keeper/keeperLink.ts). */
export type KeeperEvent = { type: 'KEEPER_BACK' };

export type SupervisorEvent = GroupEvent | ModelEvent | ModelRequestEvent | KeeperEvent | { type: 'STOP'; reason?: string };
