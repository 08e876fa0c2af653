// The programmatic API: start a node from options, watch it, await readiness, stop it.
// The CLI (src/main.ts) is a thin layer over this.
import { createActor, type SnapshotFrom } from 'xstate';
import { WorkerRegistry } from './actors/workerRegistry.js';
import { RankFailedError, WeightdError } from './errors.js';
import { createLogger, flushLogger, type Logger } from './log.js';
import { supervisorMachine, type NodeFailure, type RankStatus } from './machines/supervisor.js';
import { resolveNodeOptions, type NodeConfig, type NodeOptions } from './nodeOptions.js';
import type { RankTableEntry } from './rendezvous/rankTable.js';

export type NodeState = 'init' | 'rendezvous' | 'loading' | 'ready' | 'stopping' | 'stopped' | 'failed';

export interface NodeStatus {
  state: NodeState;
  nodeRank: number;
  nnodes: number;
  tpSize: number;
  localWorldSize: number;
  model: string;
  architecture?: string;
  fingerprint?: string;
  rankTable: RankTableEntry[];
  ranks: RankStatus[];
  failure?: NodeFailure;
}

/** How a node ended: stopped on request, or failed (with the cause). */
export interface NodeResult {
  state: 'stopped' | 'failed';
  failure?: NodeFailure;
}

export interface WeightdNode {
  readonly config: NodeConfig;
  readonly log: Logger;
  status(): NodeStatus;
  /** Calls `listener` on every state change (and now, with the current status). */
  onStateChange(listener: (status: NodeStatus) => void): () => void;
  /** Resolves when every local rank is resident; rejects if the node fails first. */
  readonly ready: Promise<NodeStatus>;
  /** Resolves when the node has ended and every worker thread is gone. */
  readonly done: Promise<NodeResult>;
  /** Stops every rank, frees all memory and resolves when the node has ended. */
  stop(reason?: string): Promise<NodeResult>;
}

type Snapshot = SnapshotFrom<typeof supervisorMachine>;

function statusOf(snap: Snapshot, config: NodeConfig): NodeStatus {
  const ctx = snap.context;
  return {
    state: snap.value as NodeState,
    nodeRank: config.nodeRank,
    nnodes: config.nnodes,
    tpSize: config.tpSize,
    localWorldSize: config.localWorldSize,
    model: config.modelDir,
    architecture: ctx.prepared?.plan.architecture,
    fingerprint: ctx.prepared?.plan.fingerprint,
    rankTable: ctx.rankTable,
    ranks: ctx.ranks,
    failure: ctx.failure,
  };
}

/**
 * Starts a node. Rejects with UsageError (before anything starts) when an option is invalid;
 * every later failure is reported through `ready`, `done` and the status.
 */
export async function startNode(options: NodeOptions): Promise<WeightdNode> {
  const config = await resolveNodeOptions(options);
  const log = options.logger ?? createLogger({ nodeRank: config.nodeRank, level: options.logLevel });
  const workers = new WorkerRegistry();
  const actor = createActor(supervisorMachine, { input: { config, log, workers } });
  const listeners = new Set<(s: NodeStatus) => void>();

  let resolveReady!: (s: NodeStatus) => void;
  let rejectReady!: (e: Error) => void;
  const ready = new Promise<NodeStatus>((res, rej) => ((resolveReady = res), (rejectReady = rej)));
  // A caller that only awaits `done` must not see an unhandled rejection from `ready`.
  ready.catch(() => {});

  let resolveDone!: (r: NodeResult) => void;
  const done = new Promise<NodeResult>((res) => (resolveDone = res));

  let lastState: string | undefined;
  const finish = async (result: NodeResult) => {
    await workers.drain();
    // Locks a serve actor never took over (the node ended before serving); idempotent.
    for (const lock of actor.getSnapshot().context.prepared?.locks ?? []) lock.release();
    if (result.failure) log.error({ code: result.failure.code, rank: result.failure.globalRank }, result.failure.message);
    log.info({ state: result.state }, 'node ended');
    await flushLogger(log);
    resolveDone(result);
  };

  actor.subscribe({
    next(snap) {
      const status = statusOf(snap, config);
      if (status.state !== lastState) {
        lastState = status.state;
        log.debug({ state: status.state }, 'supervisor state');
        for (const l of listeners) l(status);
        if (status.state === 'ready') resolveReady(status);
      }
      if (snap.status === 'done') {
        const failure = snap.context.failure;
        if (failure || snap.value === 'failed') {
          rejectReady(new RankFailedError(failure?.code ?? 'E_FAILED', failure?.message ?? 'node failed', { failure }));
          void finish({ state: 'failed', failure });
        } else {
          rejectReady(new WeightdError('E_STOPPED', 'node stopped before it was ready'));
          void finish({ state: 'stopped' });
        }
      }
    },
    error(err) {
      // A bug inside the machine itself: fail loudly rather than hang.
      const failure: NodeFailure = { name: 'Error', code: 'E_INTERNAL', message: `supervisor crashed: ${(err as Error).message}` };
      rejectReady(new WeightdError(failure.code, failure.message));
      void finish({ state: 'failed', failure });
    },
  });
  actor.start();

  return {
    config,
    log,
    ready,
    done,
    status: () => statusOf(actor.getSnapshot(), config),
    onStateChange(listener) {
      listeners.add(listener);
      listener(statusOf(actor.getSnapshot(), config));
      return () => listeners.delete(listener);
    },
    async stop(reason) {
      if (actor.getSnapshot().status === 'active') {
        log.info({ reason }, 'stopping');
        actor.send({ type: 'STOP', reason });
      }
      return done;
    },
  };
}

