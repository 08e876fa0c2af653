// Events the supervisor machine receives. UPPER_SNAKE: its group's, its model registry's, node.load's and node.unload's.
import type { GroupEvent } from '../rendezvous/groupEvents.js';
import type { ModelRegistryReport, ModelRequestEvent } from '../models/modelHost.js';

/** The node's keeper answers again after it was lost or absent: every model's ranks hand it their segments again (src/keeper/keeperLink.ts). */
export type KeeperEvent = { type: 'KEEPER_BACK' };

export type SupervisorEvent = GroupEvent | ModelRegistryReport | ModelRequestEvent | KeeperEvent | { type: 'STOP'; reason?: string };
