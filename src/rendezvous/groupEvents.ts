// Events between the supervisor machine and its group session (src/actors/groupSession.ts).
import type { SerializedError } from '../errors.js';
import type { RankTableEntry } from './rankTable.js';

/** Sent by the group session to the supervisor. */
export type GroupEvent =
  | { type: 'GROUP_JOINED'; rankTable: RankTableEntry[] }
  | { type: 'GROUP_READY' }
  | { type: 'GROUP_FAILED'; error: SerializedError }
  | { type: 'PEER_LOST'; nodeRank: number; reason: string }
  | { type: 'PEER_BACK'; nodeRank: number }
  /** During rendezvous: who has joined so far, as node 0's coordinator last said. */
  | { type: 'GROUP_WAITING'; joined: number[]; missing: number[] }
  /** On node 0: its coordinator's state changed (src/machines/coordinator.ts). */
  | { type: 'COORDINATOR_STATE'; state: string };

/** Sent by the supervisor to the group session. */
export type GroupCommand = { type: 'NODE_READY' } | { type: 'NODE_FAILED'; error: SerializedError };
