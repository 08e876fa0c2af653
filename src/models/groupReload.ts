// Loading a model that spans the group again once a node's copy of its files changed
// (docs/multi-node.md, "A checkpoint changed under a model across nodes").
//
// Every node's ranks of a version must hold the same bytes, so the node that finds its copy stale
// cannot load the model again alone. It tells node 0 (model_stale), node 0 tells every node
// (model_reload), and each node loads the model again from its own files, as `weightd ctl load`
// on every node would: the loads gather as one model group (src/models/modelGroupMachine.ts),
// which serves the new version on every node or refuses it on every node.
//
// A node whose files still hold the version it serves (its copy did not change) does not load it
// again: it joins that version's group as resident at once (ModelControl.load, as for a
// `ctl load` of a version it serves). If the others' files changed, the
// group's fingerprints differ and it is refused, naming both nodes and the fields that differ
// (E_MODEL_GROUP_MISMATCH); if no node's content changed (a file touched), the group commits that
// same version, which the nodes that found it stale serve again.
import { WeightdError, serializeError } from '../errors.js';
import type { Logger } from '../log.js';
import type { LoadResult, NodeStatus } from '../nodeStatus.js';
import type { ModelHost } from './modelHost.js';
import type { ModelSpec } from './modelSpecs.js';

/** One version of a model as this node planned it. */
export interface PlannedVersion {
  spec: ModelSpec;
  fingerprint: string;
}

/** This node's stale version of `spec`'s model goes to node 0, which has every node reload it (GroupReload). */
export function tellGroupStale(host: Pick<ModelHost, 'send'>, status: NodeStatus, spec: ModelSpec, log: Logger): void {
  const stale = status.models.findLast((m) => m.name === spec.name && m.stale !== undefined && m.fingerprint !== undefined);
  if (!stale) {
    log.error({ name: spec.name }, `model "${spec.name}" spans the group but no stale version of it is listed here; load it with weightd ctl load on every node`);
    return;
  }
  log.warn({ name: spec.name, fingerprint: stale.fingerprint }, `model "${spec.name}" spans the group: node 0 is told, and has every node load it again from its files`);
  host.send({ type: 'MODEL_GROUP_STALE', name: spec.name, fingerprint: stale.fingerprint! });
}

export interface GroupReloadOptions {
  host: Pick<ModelHost, 'send'>;
  /** The versions this node planned (its own model and those loaded since), oldest first. */
  versions: () => PlannedVersion[];
  /** ModelControl.reload with `group`: loads the model again here, retried as a stale model's reload is. */
  reload: (spec: ModelSpec) => Promise<LoadResult | undefined>;
  log: Logger;
}

/**
 * Node 0's word that a version of a model across the group went stale on some node: reloads it on
 * this one. Each word is acted on, also a second node's report of the same change: its reload
 * waits for the first to end (E_LOAD_BUSY), then finds the version that serves and joins a swap
 * of it that every node joins the same way. A report ignored here could leave a swap that another
 * node's later report started without this node.
 */
export class GroupReload {
  readonly #o: GroupReloadOptions;

  constructor(options: GroupReloadOptions) {
    this.#o = options;
  }

  /** Never rejects: the outcome is logged (and, for the group, decided by node 0). */
  async reload(name: string, fingerprint: string, foundBy: number): Promise<void> {
    const { host, log } = this.#o;
    const mine = this.#o.versions().filter((v) => v.spec.name === name);
    // The version that went stale if this node planned it, else the newest of that name.
    const version = mine.findLast((v) => v.fingerprint === fingerprint) ?? mine.at(-1);
    if (!version) {
      const error = new WeightdError('E_UNKNOWN_MODEL', `node ${foundBy} found model "${name}" stale, but this node never loaded a model of that name: load it with weightd ctl load on every node`, { name });
      log.error({ name, peer: foundBy }, error.message);
      // The others must not wait for this node: their model group fails at once.
      host.send({ type: 'MODEL_PLAN_FAILED', name, error: serializeError(error) });
      return;
    }
    log.warn({ name, fingerprint, peer: foundBy }, `model "${name}" went stale on node ${foundBy}: loading it again from this node's files (${version.spec.modelDir})`);
    // A version this node serves already joins the swap as resident (ModelControl.load).
    await this.#o.reload(version.spec);
  }
}
