// Node 0's model groups: one src/models/modelGroupMachine.ts actor per model name being loaded across
// the group, fed by the coordinator with its members' model_* messages and losses. An aborted
// group's verdict outlives it until every node has heard it (or the rendezvous deadline passes),
// so a node that plans late, or fails before joining, gets the same verdict at once instead of
// starting a group alone and waiting for its deadline.
import { createActor, type Actor } from 'xstate';
import type { Logger } from '../log.js';
import { modelGroupMachine, peerFailedVerdict } from '../models/modelGroupMachine.js';
import type { Rejection } from './checkJoin.js';
import type { ClientMessage, ServerMessage } from './groupMessages.js';

type ModelMessage = Extract<ClientMessage, { type: 'model_join' | 'model_resident' | 'model_failed' }>;

export interface ModelGroupsOptions {
  nnodes: number;
  /** --rendezvous-timeout: how long a group gathers, and how long a verdict waits to be heard. */
  timeoutMs: number;
  log: Logger;
  /** Writes `message` to the connections of these node ranks. */
  send: (nodeRanks: number[], message: ServerMessage) => void;
}

interface Verdict {
  /** Undefined: a node could not plan the model, so the verdict holds for any version of the name. */
  fingerprint?: string;
  rejection: Rejection;
  /** Node ranks that were sent it. */
  told: Set<number>;
  expiry: NodeJS.Timeout;
}

/** The nodes that know an attempt's outcome: its members, and the node its verdict names. */
function informedOf(joined: number[], verdict: Rejection): Set<number> {
  const told = new Set(joined);
  if (typeof verdict.details.nodeRank === 'number') told.add(verdict.details.nodeRank);
  return told;
}

export class ModelGroups {
  readonly #o: ModelGroupsOptions;
  readonly #groups = new Map<string, Actor<typeof modelGroupMachine>>();
  readonly #verdicts = new Map<string, Verdict>();

  constructor(options: ModelGroupsOptions) {
    this.#o = options;
  }

  receive(nodeRank: number, m: ModelMessage): void {
    const group = this.#groups.get(m.name);
    if (group) {
      // A report about another version (one no longer loading) changes nothing; a node that
      // could not plan the model fails whichever version loads.
      const unplanned = m.type === 'model_failed' && m.fingerprint === undefined;
      if (m.type !== 'model_join' && !unplanned && group.getSnapshot().context.fingerprint !== m.fingerprint) return;
      if (m.type === 'model_join') group.send({ type: 'JOIN', nodeRank, fingerprint: m.fingerprint, fingerprintFields: m.fingerprintFields, tpSize: m.tpSize });
      else if (m.type === 'model_resident') group.send({ type: 'RESIDENT', nodeRank });
      else group.send({ type: 'FAILED', nodeRank, code: m.code, message: m.message });
      return;
    }
    const verdict = this.#verdicts.get(m.name);
    // A node that already heard the verdict and joins again is retrying (its files fixed, say):
    // that starts a new attempt, not the old one's abort.
    const retry = m.type === 'model_join' && verdict?.told.has(nodeRank) === true;
    if (verdict && !retry && (verdict.fingerprint === undefined || verdict.fingerprint === m.fingerprint)) {
      this.#tell(m.name, verdict, [nodeRank], m.fingerprint);
      return;
    }
    if (m.type === 'model_join') this.#start(nodeRank, m);
    // Failed before any node joined (planning failed): the nodes that join later hear it.
    else if (m.type === 'model_failed') this.#remember(m.name, m.fingerprint, peerFailedVerdict(m.name, nodeRank, m.code, m.message), new Set([nodeRank]));
  }

  /** A member's connection is gone: every group it joined is aborted. */
  nodeLost(nodeRank: number, reason: string): void {
    for (const group of this.#groups.values()) group.send({ type: 'NODE_LOST', nodeRank, reason });
  }

  close(): void {
    for (const group of this.#groups.values()) group.stop();
    this.#groups.clear();
    for (const v of this.#verdicts.values()) clearTimeout(v.expiry);
    this.#verdicts.clear();
  }

  #start(nodeRank: number, m: Extract<ModelMessage, { type: 'model_join' }>): void {
    this.#verdicts.delete(m.name);
    const group = createActor(
      modelGroupMachine.provide({ actions: { send: (_, p) => this.#o.send(p.nodeRanks, p.message) } }),
      {
        input: {
          name: m.name,
          fingerprint: m.fingerprint,
          fingerprintFields: m.fingerprintFields,
          tpSize: m.tpSize,
          nnodes: this.#o.nnodes,
          firstNodeRank: nodeRank,
          timeoutMs: this.#o.timeoutMs,
          log: this.#o.log,
        },
      },
    );
    this.#groups.set(m.name, group);
    group.subscribe({
      next: (snap) => {
        if (snap.status !== 'done' || this.#groups.get(m.name) !== group) return;
        this.#groups.delete(m.name);
        const c = snap.context;
        // Every node was sent the verdict; only those connected heard it, and only those that
        // joined know this version, or caused the verdict (failed, stated another version, or
        // were lost): any other node that joins later must hear it too.
        if (c.verdict) this.#remember(m.name, m.fingerprint, c.verdict, informedOf(c.joined, c.verdict));
      },
      error: (err) => {
        this.#o.log.error({ err, model: m.name }, 'model group machine crashed');
        this.#groups.delete(m.name);
      },
    });
    group.start();
  }

  #remember(name: string, fingerprint: string | undefined, rejection: Rejection, told: Set<number>): void {
    const previous = this.#verdicts.get(name);
    if (previous) clearTimeout(previous.expiry);
    this.#verdicts.delete(name);
    if (told.size >= this.#o.nnodes) return;
    const expiry = setTimeout(() => this.#verdicts.get(name) === verdict && this.#verdicts.delete(name), this.#o.timeoutMs);
    expiry.unref();
    const verdict: Verdict = { fingerprint, rejection, told, expiry };
    this.#verdicts.set(name, verdict);
  }

  /** `fingerprint`: the version the node asked about, which its abort must name. */
  #tell(name: string, verdict: Verdict, nodeRanks: number[], fingerprint: string | undefined): void {
    // A node that only reported its own failure has nothing to free: it needs no abort.
    if (fingerprint !== undefined) this.#o.send(nodeRanks, { type: 'model_abort', name, fingerprint, ...verdict.rejection });
    for (const r of nodeRanks) verdict.told.add(r);
    if (verdict.told.size >= this.#o.nnodes) {
      clearTimeout(verdict.expiry);
      this.#verdicts.delete(name);
    }
  }
}
