// What the supervisor's actors take and give back (src/actors/ implements them): declared here,
// beside the machine that invokes them, so the machine imports no actor's implementation file.
import type { SerializedError } from '../errors.js';
import type { Logger } from '../log.js';
import type { PlannedModel, RestoredVersions } from '../models/planModel.js';
import type { RankKeeping } from '../models/rankMessages.js';
import type { DeviceSlot } from '../native/addon.js';
import type { NodeConfig } from '../nodeOptions.js';
import type { GroupTiming } from '../rendezvous/timing.js';
import type { ServerRegistry } from '../serve/serverRegistry.js';
import type { DeviceLock } from '../wire/deviceLock.js';
import type { NodeGroupInfo, NodeManifestEntry, NodeManifestModel } from '../wire/nodeManifest.js';

export interface PrepareInput {
  config: NodeConfig;
  log: Logger;
  /** The keeper, found or started meanwhile (SupervisorInput.keeper). */
  keeper?: { socket: string; ready: Promise<void> };
  /** Where the device locks go once taken: each device's socket server takes over its lock. */
  servers: ServerRegistry;
}

export interface Prepared {
  /** The device of each local rank of the group, in local-rank order. */
  devices: DeviceSlot[];
  /** How many devices of the backend this node sees (compared across nodes at rendezvous). */
  visibleDevices: number;
  /** The private directory of this node's sockets. */
  socketDir: string;
  /**
   * One lock per local device, taken before loading so a second daemon for the same device
   * fails in milliseconds. Each serve actor owns its lock from then on; startNode unlocks any
   * left when the node ends earlier.
   */
  locks: DeviceLock[];
  /** Where the ranks adopt and keep their segments (absent: --keeper off). */
  keeper?: RankKeeping;
  /**
   * Every model the node starts with, planned: config.models in order, then those restored from
   * the keeper. The first is the one its group forms around: the rendezvous compares its plan,
   * on `devices`.
   */
  models: PlannedModel[];
  /** Versions writers committed that the keeper holds: served once the node is ready (src/actors/restoreWritten.ts). */
  written?: RestoredVersions;
}

export interface GroupSessionInput {
  config: NodeConfig;
  prepared: Prepared;
  log: Logger;
  /** Overrides of the rendezvous clocks (else defaults, then WEIGHTD_RDZV_* variables). */
  timing?: Partial<GroupTiming>;
}

export interface NodeManifestContent {
  /** The ranks of the newest version of the node's first model's name that serves (else drains): what a client that names no model reads. */
  entries: NodeManifestEntry[];
  models: NodeManifestModel[];
  group: NodeGroupInfo;
}

export interface PublishNodeManifestInput {
  socketDir: string;
  manifest: NodeManifestContent;
  log: Logger;
  /** How long a change of versions alone waits to be written with those after it (default VERSIONS_WRITE_AFTER_MS, src/actors/publishNodeManifest.ts). */
  versionsAfterMs?: number;
}

export type PublishCommand = { type: 'REPUBLISH'; manifest: NodeManifestContent };

export interface ReportStartupFailureInput {
  config: NodeConfig;
  failure: SerializedError;
  log: Logger;
}
