// Events the supervisor machine receives. UPPER_SNAKE, each with the local rank it concerns.
import type { SerializedError } from '../errors.js';
import type { RankEvent } from '../models/rankContract.js';
import type { GroupEvent } from '../rendezvous/groupEvents.js';
import type { ServeEvent } from '../serve/serveEvents.js';
import type { PlannedModel } from '../models/planModel.js';
import type { IdentityChange } from '../files/fileIdentity.js';
import type { ModelSpec } from '../models/modelSpecs.js';
import type { NodeFailure } from '../nodeStatus.js';
import type { NodeManifestEntry } from '../wire/nodeManifest.js';

/** What a model actor tells the supervisor. */
export type ModelEvent =
  /** Every rank serves: the version is attachable. `entries`: its ranks, for the node manifest. */
  | { type: 'MODEL_SERVING'; id: string; entries: NodeManifestEntry[] }
  /** A model that spans the group is resident here, not attachable yet (src/models/modelGroupMachine.ts). */
  | { type: 'MODEL_RESIDENT'; id: string }
  | { type: 'MODEL_FAILED'; id: string; error: NodeFailure }
  /** Released or stopped: the actor has ended and its memory is freed. */
  | { type: 'MODEL_GONE'; id: string }
  /** Its checkpoint files changed since it was planned: it drains, and `spec` is loaded again. */
  | { type: 'MODEL_STALE'; id: string; spec: ModelSpec; changes: IdentityChange[]; described: string };

/** From the programmatic API (node.load, node.unload; the control socket goes through them). */
export type ModelRequestEvent =
  /** `id`: the model actor's id, which the caller names so that it can follow that actor (modelLoadId). */
  | { type: 'MODEL_LOAD'; id: string; planned: PlannedModel }
  /** A model that would span the group could not be planned here: the other nodes must not wait for it. */
  | { type: 'MODEL_PLAN_FAILED'; name: string; error: SerializedError }
  /** `ids`: model actors to unload; `own`: the node's own model too. */
  | { type: 'MODEL_UNLOAD'; ids: string[]; own: boolean; force: boolean };

/** The node's keeper answers again after it was lost or absent: every rank hands it its segments again (src/keeper/keeperLink.ts). */
export type KeeperEvent = { type: 'KEEPER_BACK' };

export type SupervisorEvent = RankEvent | ServeEvent | GroupEvent | ModelEvent | ModelRequestEvent | KeeperEvent | { type: 'STOP'; reason?: string };
