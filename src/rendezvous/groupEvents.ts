// Events between the supervisor machine and its group session (src/actors/groupSession.ts).
import type { NodeContent } from './nodeContent.js';
import type { SerializedError } from '../errors.js';
import type { RankTableEntry } from '../wire/rankTable.js';

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
  | { type: 'COORDINATOR_STATE'; state: string }
  /** A model that spans the group is resident on every node: serve it. */
  | { type: 'MODEL_GROUP_COMMIT'; name: string; fingerprint: string }
  /** A model that spans the group failed somewhere (or node 0 is gone): free it. */
  | { type: 'MODEL_GROUP_ABORT'; name: string; fingerprint: string; error: SerializedError }
  /** Node `nodeRank` found this version of a model that spans the group stale: load the model again (src/models/groupReload.ts). */
  | { type: 'MODEL_GROUP_RELOAD'; name: string; fingerprint: string; nodeRank: number };

/** A model version across the group: what a node states when it joins its model group. */
export interface ModelGroupJoin {
  name: string;
  fingerprint: string;
  fingerprintFields?: Record<string, string>;
  tpSize: number;
}

/** Sent by the supervisor to the group session. */
export type GroupCommand =
  /** content: what the node holds (nodeContent.ts), compared across nodes at the ready barrier. */
  | { type: 'NODE_READY'; content?: NodeContent }
  | { type: 'NODE_FAILED'; error: SerializedError }
  | ({ type: 'MODEL_GROUP_JOIN' } & ModelGroupJoin)
  | { type: 'MODEL_GROUP_RESIDENT'; name: string; fingerprint: string }
  /** No fingerprint: the model could not be planned here. */
  | { type: 'MODEL_GROUP_FAILED'; name: string; fingerprint?: string; error: SerializedError }
  /** This node's files of this version, which spans the group, changed: node 0 has every node load it again. */
  | { type: 'MODEL_GROUP_STALE'; name: string; fingerprint: string };
