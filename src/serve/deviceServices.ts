// What the command handlers see of a device's socket: the model versions it serves and its
// counters. An interface of its own, so the handlers and the server that implements it
// (deviceServer.ts) do not import each other.
import type { Caller } from './leaseTable.js';
import type { RankService } from './rankService.js';
import type { WatchTable } from './watchTable.js';
import type { UpdateDesk } from './updateDesk.js';
import type { PublishDesk } from './publishDesk.js';
import type { PullPlanDesk } from './pullPlanDesk.js';

/** The model versions a device serves, as the handlers look them up. */
export interface DeviceServices {
  /** Every version served on the device: the node's first model's first version, then the others in the order they were added. */
  readonly all: readonly RankService[];
  /** The version with this rank fingerprint, in any state. */
  byFingerprint(fingerprint: string): RankService | undefined;
  /** The version whose lease this is, when the caller may name it. */
  byLease(caller: Caller, leaseId: string): RankService | undefined;
  /** What a request that names no version gets: the first that still serves or drains (the node's first model's while it does), else the first. */
  fallback(): RankService | undefined;
  /** The newest version of `name` that serves (what a draining version's clients should move to). */
  newestServing(name: string): RankService | undefined;
  readonly counters: { requests: number; protocolErrors: number; refusedPeers: number };
  readonly connectionCount: number;
  /** Whether the connection is still open (a request that awaited may outlive its connection). */
  isConnected(connectionId: number): boolean;
  readonly startedAt: number;
  readonly watches: WatchTable;
  /** Writers' updates (updateDesk.ts), where the socket belongs to a node that can serve a new version. */
  readonly updates?: UpdateHost;
}

/** What a device's socket needs of the node to take updates: the desk, and which version a service is a rank of. */
export interface UpdateHost {
  desk: UpdateDesk;
  /** Engines' publishes of processed layouts (publishDesk.ts). */
  publishes: PublishDesk;
  /** Writers' pull plans (pullPlanDesk.ts). */
  plans: PullPlanDesk;
  /** The version `service` is a rank of (ServeOptions.version) and its global ranks on this node; undefined once withdrawn. */
  versionOf(service: RankService): { version: string; ranks: number[] } | undefined;
}
