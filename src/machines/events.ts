// Events the supervisor machine receives. UPPER_SNAKE, each with the local rank it concerns.
import type { SerializedError } from '../errors.js';
import type { DeviceInfo, SegmentExport } from '../native/addon.js';
import type { RankSource } from '../nodeStatus.js';
import type { GroupEvent } from '../rendezvous/groupEvents.js';
import type { ServeEvent } from '../serve/serveEvents.js';

export type RankEvent =
  | { type: 'RANK_DEVICE'; localRank: number; info: DeviceInfo }
  | { type: 'RANK_PROGRESS'; localRank: number; bytes: number; totalBytes: number; seconds: number }
  | { type: 'RANK_LOADED'; localRank: number; device: DeviceInfo; segments: SegmentExport[]; bytes: number; seconds: number; source: RankSource }
  | { type: 'RANK_KEPT'; localRank: number; kept: boolean; reason?: string }
  | { type: 'RANK_RELEASED'; localRank: number }
  | { type: 'RANK_STOPPED'; localRank: number }
  | { type: 'RANK_FAILED'; localRank: number; error: SerializedError };

export type SupervisorEvent = RankEvent | ServeEvent | GroupEvent | { type: 'STOP'; reason?: string };
