// weightd/client: attach to a running weightd from TypeScript.
export { WeightdClient, type Attached, type AttachOptions, type ClientOptions, type Copied, type Expected } from './weightdClient.js';
export { findSocket, type FindSocketOptions } from './findSocket.js';
export { expectedFingerprint } from './expectedFingerprint.js';
export type { DeviceTensor, HostTensor } from './segmentAccess.js';
export type { TensorArray } from './tensorViews.js';
export type {
  DetachReply,
  GetStateReply,
  LeaseInfo,
  MismatchReply,
  PingReply,
  ReleaseReply,
  StateReply,
  StatsReply,
  TensorMeta,
  ModelEvent,
  ModelRef,
  WatchReply,
} from '../wire/protocol.js';
export { readNodeManifest, type NodeManifest, type NodeManifestEntry } from '../wire/nodeManifest.js';
export { defaultSocketDir } from '../wire/socketDir.js';
