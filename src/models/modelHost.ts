// The node as its models see it: what the model registry (src/models/modelRegistryMachine.ts)
// keeps of each model actor, what a model actor and node.load/node.unload tell it, what it tells
// the supervisor, and the supervisor actor as ModelControl drives it. Declared here, beside the
// models, so that src/models/ imports nothing from the machine that runs the node
// (src/machines/supervisor.ts satisfies ModelHost).
import type { ActorRefFrom, AnyActorRef, Subscription } from 'xstate';
import type { SerializedError } from '../errors.js';
import type { IdentityChange } from '../files/fileIdentity.js';
import type { NodeFailure } from '../nodeStatus.js';
import type { NodeManifestEntry, NodeManifestModel } from '../wire/nodeManifest.js';
import type { modelMachine } from './modelMachine.js';
import type { ModelSpec } from './modelSpecs.js';
import type { PlannedModel } from './planModel.js';
import type { GroupCommand, ModelGroupJoin } from '../rendezvous/groupEvents.js';

/** A model version the node serves, as the model registry tracks it (its actor has the rest). */
export interface ModelEntry {
  /** The model actor's id among the registry's children. */
  id: string;
  name: string;
  /** The checkpoint fingerprint (every rank's differs: see the entries). */
  fingerprint: string;
  tpSize: number;
  /** Started with the node: it must serve before the node is ready, and its failure fails the node (unless restored). */
  startup: boolean;
  /** Restored from an earlier daemon's run-time load (PlannedModel.origin): its failure fails it alone. */
  restored: boolean;
  /**
   * The node's first model (config.models[0]), which the rendezvous formed the group around
   * (FORMS_GROUP): its failure fails the node in any state, its ranks are the status's `ranks`,
   * and it stays listed once released (as "released").
   */
  formsGroup: boolean;
  /** Released or stopped (a model that forms the group stays listed then: its actor is kept, done). */
  gone?: boolean;
  /** Once it serves: the checkpoint tensors' digests (as any one rank has them; the group's ready barrier compares them). */
  digests?: string[];
  /** Once it serves: its ranks, for the node manifest. */
  entries?: NodeManifestEntry[];
  /** Unloaded (or superseded by a newer version of its name): it drains. */
  unloaded: boolean;
  /** A version a writer committed (PlannedModel.origin 'update'): older versions of its name stay, as --keep-versions says, rather than drain. */
  retainsOlder?: boolean;
  /**
   * A model that spans the group: "pending" until node 0 commits or aborts it everywhere
   * (src/models/modelGroupMachine.ts), then "committed". Absent for a model of this node alone.
   */
  group?: 'pending' | 'committed';
}

/**
 * A version this node serves and only vouched for in a swap across the group (MODEL_GROUP_VOUCH:
 * it joined as resident, loading nothing), with node 0's verdict once it came. One per name: the
 * latest vouch.
 */
export interface VouchedVersion {
  /** MODEL_GROUP_VOUCH's id: whoever vouched waits for this one's verdict. */
  id: string;
  name: string;
  fingerprint: string;
  verdict?: { committed: true } | { error: SerializedError };
}

/** What a model actor tells the model registry. */
export type ModelEvent =
  /** Every rank serves: the version is attachable. `entries`: its ranks, for the node manifest. */
  | { type: 'MODEL_SERVING'; id: string; entries: NodeManifestEntry[]; digests?: string[] }
  /** Every rank is loaded and its files checked: its sockets are being bound. */
  | { type: 'MODEL_STARTING'; id: string }
  /** A model that spans the group is resident here, not attachable yet (src/models/modelGroupMachine.ts). */
  | { type: 'MODEL_RESIDENT'; id: string }
  | { type: 'MODEL_FAILED'; id: string; error: NodeFailure }
  /** Released (every rank's memory freed: the registry ends the actor, or keeps the first model's servers answering) or stopped (the actor has ended). */
  | { type: 'MODEL_GONE'; id: string }
  /** Its checkpoint files changed since it was planned: it drains, and `spec` is loaded again. */
  | { type: 'MODEL_STALE'; id: string; spec: ModelSpec; changes: IdentityChange[]; described: string };

/** The models' part of node.json (src/wire/nodeManifest.ts), as the registry lists them. */
export interface ModelListing {
  /** The ranks of the newest version of the node's first model's name that serves (else drains): what a client that names no model reads. */
  entries: NodeManifestEntry[];
  models: NodeManifestModel[];
}

/** What the model registry tells the supervisor, which keeps the node's life and its group session. */
export type ModelRegistryReport =
  /** The model the group formed around binds its sockets: the node is starting. */
  | { type: 'GROUP_MODEL_STARTING' }
  /** Every model the node started with serves: the node is ready. `digests`: the first model's, for the group's ready barrier. */
  | { type: 'STARTUP_MODELS_SERVING'; digests?: string[]; listing: ModelListing }
  /** A model whose failure fails the node (one it started with, or the group's at any time) failed. */
  | { type: 'MODEL_FAILS_NODE'; failure: NodeFailure }
  /** The models listed in node.json changed. */
  | { type: 'MODELS_LISTED'; listing: ModelListing }
  /** A command for the group session (a swap across the group, a reload across it). */
  | { type: 'TELL_GROUP'; command: GroupCommand }
  /** A model's files changed: it drains, and the node loads `spec` again. */
  | { type: 'MODEL_RELOAD'; spec: ModelSpec }
  /** After MODELS_STOP: every model has stopped. */
  | { type: 'MODELS_STOPPED' }
  /** After MODELS_STOP: some model's ranks did not stop in time (E_STOP_TIMEOUT). */
  | { type: 'MODELS_STOP_TIMED_OUT'; failure: NodeFailure };

/** From the programmatic API (node.load, node.unload; the control socket goes through them). */
export type ModelRequestEvent =
  /** `id`: the model actor's id, which the caller names so that it can follow that actor (modelLoadId). */
  | { type: 'MODEL_LOAD'; id: string; planned: PlannedModel }
  /** A model that would span the group could not be planned here: the other nodes must not wait for it. */
  | { type: 'MODEL_PLAN_FAILED'; name: string; error: SerializedError }
  /** `ids`: the model actors to unload. */
  | { type: 'MODEL_UNLOAD'; ids: string[]; force: boolean }
  /** This node's files of a version that spans the group changed: node 0 is told (src/models/groupReload.ts). */
  | { type: 'MODEL_GROUP_STALE'; name: string; fingerprint: string }
  /**
   * A swap across the group of a version this node serves already (a reload across the group
   * whose files here still hold it, or a `ctl load` of it): it joins that version's model group
   * as resident at once, without loading it again.
   */
  | { type: 'MODEL_GROUP_VOUCH'; id: string; join: ModelGroupJoin };

/** The supervisor actor, as node.load and node.unload (ModelControl) drive it. */
export interface ModelHost {
  send(event: ModelRequestEvent): void;
  getSnapshot(): ModelHostSnapshot;
  subscribe(observer: { next?: () => void; error?: (err: unknown) => void; complete?: () => void }): Subscription;
}

export interface ModelHostSnapshot {
  /** The node's state (nodeStatus.ts NodeState). */
  value: unknown;
  status: 'active' | 'done' | 'error' | 'stopped';
  children: Record<string, AnyActorRef | undefined>;
}

/** The model registry's id among the supervisor's children (from the node's "loading" on). */
export const MODEL_REGISTRY_ID = 'models';

/** The model registry actor (src/models/modelRegistryMachine.ts) as its models' readers see it. */
export interface ModelRegistryActor {
  getSnapshot(): { value: unknown; status: 'active' | 'done' | 'error' | 'stopped'; context: { models: ModelEntry[]; vouched: VouchedVersion[] }; children: Record<string, AnyActorRef | undefined> };
  subscribe(observer: { next?: () => void; error?: (err: unknown) => void }): Subscription;
}

/** The node's model registry, once the supervisor has spawned it. */
export function modelRegistry(snapshot: Pick<ModelHostSnapshot, 'children'>): ModelRegistryActor | undefined {
  return snapshot.children[MODEL_REGISTRY_ID] as ModelRegistryActor | undefined;
}

/** The models the node serves, as its registry lists them; none before the registry exists. */
export function modelEntries(snapshot: Pick<ModelHostSnapshot, 'children'>): ModelEntry[] {
  return modelRegistry(snapshot)?.getSnapshot().context.models ?? [];
}

/**
 * A model's failure as said of that model (a load's error, the log line of a model dropped
 * alone): a rank's failure names the rank only (as the node's failure always has), so the model
 * is named before it.
 */
export function modelFailureMessage(name: string, failure: NodeFailure): string {
  return failure.localRank === undefined ? failure.message : `model "${name}": ${failure.message}`;
}

/** The id of the `n`th model the node starts with (config.models order, then those restored from the keeper). */
export const modelActorId = (n: number) => `model-${n}`;

/** The node's first model's actor: the one its group forms around. */
export const FIRST_MODEL_ID = modelActorId(0);

/** The id of the `n`th model loaded at run time (MODEL_LOAD.id): apart from those started with the node. */
export const modelLoadId = (n: number) => `load-${n}`;

/** A model actor, by its id (ModelEntry.id), found from the supervisor's snapshot through its registry. */
export function modelActor(snapshot: Pick<ModelHostSnapshot, 'children'>, id: string): ActorRefFrom<typeof modelMachine> | undefined {
  return modelRegistry(snapshot)?.getSnapshot().children[id] as ActorRefFrom<typeof modelMachine> | undefined;
}
