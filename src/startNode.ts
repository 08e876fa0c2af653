// The programmatic API: start a node from options, watch it, await readiness, stop it.
// The CLI (src/main.ts) is a thin layer over this.
import type { Registry } from 'prom-client';
import { createActor, type SnapshotFrom } from 'xstate';
import { nodeActors, rankWorkerModule, warmRankWorkerModule } from './actors/nodeActors.js';
import type { WarmRankWorkerData } from './actors/warmRankWorker.js';
import { ServerRegistry } from './serve/serverRegistry.js';
import { WorkerRegistry } from './models/workerRegistry.js';
import { RankFailedError, receivedCode, WeightdError } from './errors.js';
import { EventFeed, type NodeEvent, type NodeEventListener } from './inspect/eventFeed.js';
import { NodeMetrics } from './inspect/nodeMetrics.js';
import { ProgressReporter } from './inspect/progressReporter.js';
import { createLogger } from './createLogger.js';
import { flushLogger, type Logger } from './log.js';
import { supervisorMachine } from './machines/supervisor.js';
import { FIRST_MODEL_ID, modelActor, modelEntries, modelRegistry } from './models/modelHost.js';
import type { LoadResult, ModelState, ModelStatus, NodeFailure, NodeResult, NodeState, NodeStatus, RankStatus, RegistryState, ServedRankStatus, UnloadResult } from './nodeStatus.js';
import type { ModelRequest } from './models/modelSpecs.js';
import type { EvictionPolicy } from './models/evictionPolicy.js';
import { ModelControl } from './models/modelControl.js';
import { GroupReload, type PlannedVersion } from './models/groupReload.js';
import { ControlServer } from './control/controlServer.js';
import { resolveNodeOptions, type NodeConfig, type NodeOptions } from './nodeOptions.js';
import { KeeperLink } from './keeper/keeperLink.js';
import type { RestoredVersions } from './models/planModel.js';
import { keeperSocketPath } from './keeper/keeperSocketPath.js';
import { removeSocketDirIfCreated, resolveSocketDir } from './wire/socketDir.js';

export interface WeightdNode {
  readonly config: NodeConfig;
  readonly log: Logger;
  status(): NodeStatus;
  /** Calls `listener` on every state change (and now, with the current status). */
  onStateChange(listener: (status: NodeStatus) => void): () => void;
  /**
   * Calls `listener` with every event from now on: those the supervisor handled (with the state
   * it moved to) and the commands it sent its rank, serve and group actors. RANK_PROGRESS is
   * sampled (one per rank per second); status() has every byte.
   */
  onEvent(listener: NodeEventListener): () => void;
  /** The most recent events (up to 256), oldest first. */
  recentEvents(): NodeEvent[];
  /** Prometheus text of this node's metrics (what /metrics serves). */
  metrics(): Promise<string>;
  /** The node's own prom-client Registry, to merge into a host program's (Registry.merge); built on first read. */
  readonly metricsRegistry: Registry;
  /** Base URL of the inspect server (e.g. http://127.0.0.1:9464) when `inspect` was given. */
  readonly inspectUrl?: string;
  /** Resolves when every local rank is resident; rejects if the node fails first. */
  readonly ready: Promise<NodeStatus>;
  /** Resolves when the node has ended and every worker thread is gone. */
  readonly done: Promise<NodeResult>;
  /** Stops every rank, frees all memory and resolves when the node has ended. */
  stop(reason?: string): Promise<NodeResult>;
  /**
   * Loads a model beside those resident (docs/operations.md, Several models) and resolves once it
   * serves: a newer version of a name that is loaded then takes the older one's place (the older
   * drains). Refused before anything is allocated when it does not fit (E_DOES_NOT_FIT). A model
   * already loaded resolves at once with alreadyLoaded. `evict`: this load's eviction policy
   * instead of the node's (NodeOptions.evict); the result lists what it evicted.
   */
  load(request: ModelRequest, options?: { evict?: EvictionPolicy }): Promise<LoadResult>;
  /**
   * Unloads every version of a model, by name or fingerprint: no new lease from now on, freed
   * once the last lease ends, or at once with force (revoking the leases; their holders hear it).
   */
  unload(target: string, options?: { force?: boolean }): Promise<UnloadResult>;
  /** The address of the control socket (weightd ctl), when `control` was not false. */
  readonly controlSocket?: string;
}

type Snapshot = SnapshotFrom<typeof supervisorMachine>;

/** A version is current while each of its ranks is the newest of its name that serves on its device. */
const isCurrent = (ranks: ServedRankStatus[]) => ranks.length > 0 && ranks.every((r) => r.current === true);

/**
 * The status of each model version on the node, oldest first, or of the versions of `name` only:
 * a writer's commit and a rollback ask for their name's alone, not the node's whole status.
 */
export function modelStatuses(snap: Snapshot, servers?: ServerRegistry, name?: string): ModelStatus[] {
  const served = (r: RankStatus, version: string, fingerprint: string | undefined): ServedRankStatus => {
    const s = fingerprint === undefined ? undefined : servers?.stats(version, fingerprint);
    return s ? { ...r, clients: s.connections, leases: s.leases, serve: s.status, lastAttachedAt: s.lastAttachedAt, servingSince: s.servingSince, current: s.current, processed: s.processed } : r;
  };
  const entries = modelEntries(snap);
  return (name === undefined ? entries : entries.filter((m) => m.name === name)).map((m): ModelStatus => {
    const child = modelActor(snap, m.id)?.getSnapshot();
    const plan = child?.context.planned.plan;
    const modelRanks = (child?.context.ranks ?? []).map((r) => served(r, m.id, plan?.ranks[r.globalRank]?.fingerprint));
    return {
      name: m.name,
      own: m.formsGroup,
      // A model actor torn down with the node (not ended by its own machine) is in the node's end state.
      state: child?.status === 'stopped' ? (snap.value as Exclude<NodeState, 'ready'>) : ((child?.value as ModelState | undefined) ?? 'admitting'),
      model: child?.context.planned.spec.modelDir ?? '',
      fingerprint: m.fingerprint,
      tpSize: m.tpSize,
      version: child?.context.planned.version ?? 0,
      current: isCurrent(modelRanks),
      ...totals(modelRanks),
      ranks: modelRanks,
      failure: child?.context.failure,
      ...(child?.context.stale ? { stale: child.context.stale } : {}),
    };
  });
}

/** The status of a supervisor snapshot (exported for tests that drive the machine directly). */
export function statusOf(snap: Snapshot, config: NodeConfig, servers?: ServerRegistry, keeper?: KeeperLink): NodeStatus {
  const ctx = snap.context;
  const models = modelStatuses(snap, servers);
  const first = ctx.prepared?.models[0];
  // Before its model actor exists (or once the node ended without one), the first model is in the node's state.
  const group = models.find((m) => m.own) ?? {
    name: config.models[0].name,
    own: true,
    state: snap.value as Exclude<NodeState, 'ready'>,
    model: config.models[0].modelDir,
    fingerprint: first?.plan.fingerprint,
    tpSize: config.tpSize,
    version: 0,
    current: false,
    bytes: 0,
    processedBytes: 0,
    leases: 0,
    ranks: [],
  };
  return {
    state: snap.value as NodeState,
    nodeRank: config.nodeRank,
    nnodes: config.nnodes,
    tpSize: config.tpSize,
    localWorldSize: config.localWorldSize,
    model: config.models[0].modelDir,
    architecture: first?.plan.architecture,
    fingerprint: first?.plan.fingerprint,
    rankTable: ctx.rankTable,
    ranks: group.ranks,
    models: models.includes(group) ? models : [group, ...models],
    peers: ctx.peers,
    groupReady: ctx.groupReady,
    formation: ctx.formation,
    coordinatorState: ctx.coordinatorState,
    registryState: modelRegistry(snap)?.getSnapshot().value as RegistryState | undefined,
    keeper: keeper?.status(),
    failure: ctx.failure,
  };
}

/** Every version the node planned, its own model first, then those loaded since, oldest first. */
function plannedVersions(snap: Snapshot): PlannedVersion[] {
  return modelEntries(snap).flatMap((m): PlannedVersion[] => {
    const planned = modelActor(snap, m.id)?.getSnapshot().context.planned;
    return planned ? [{ spec: planned.spec, fingerprint: m.fingerprint }] : [];
  });
}

function totals(ranks: ServedRankStatus[]): { bytes: number; processedBytes: number; leases: number; lastUsedAt?: number } {
  const used = ranks.map((r) => r.lastAttachedAt ?? r.servingSince).filter((t): t is number => t !== undefined);
  return {
    bytes: ranks.reduce((n, r) => n + (r.state === 'released' ? 0 : r.bytes), 0),
    processedBytes: ranks.reduce((n, r) => n + (r.processed ?? []).reduce((m, p) => m + p.bytes, 0), 0),
    leases: ranks.reduce((n, r) => n + (r.leases ?? 0), 0),
    ...(used.length > 0 ? { lastUsedAt: Math.max(...used) } : {}),
  };
}

/** Code a node runs, as opposed to what its options configure; each has the real one as default. */
export interface NodeModules {
  /**
   * The module each rank's worker thread runs: default src/actors/rankWorker.ts. Another must
   * speak src/models/rankMessages.ts, as one that wraps src/actors/rankPhases.ts does (the
   * tests' fixture workers, test/actors/fixtures).
   */
  rankWorker?: URL;
}

/**
 * Starts a node. Rejects with UsageError (before anything starts) when an option is invalid;
 * every later failure is reported through `ready`, `done` and the status.
 */
export async function startNode(options: NodeOptions, { rankWorker = rankWorkerModule }: NodeModules = {}): Promise<WeightdNode> {
  const config = await resolveNodeOptions(options);
  const log = options.logger ?? createLogger({ nodeRank: config.nodeRank, level: options.logLevel });
  const workers = new WorkerRegistry({ warmModule: warmRankWorkerModule });
  const servers = new ServerRegistry({ defaultModel: config.models[0].name, processedMaxPercent: config.processedMaxPercent });
  const feed = new EventFeed();
  // Found or started while the node plans (prepareNode waits for it), so that the ranks can
  // adopt what it holds. start() never rejects: a node without its keeper still serves.
  const { mode } = config.keeper;
  // Checked before anything starts, so that a refused directory leaves no keeper or listener.
  const socketDir = mode !== 'off' || config.control ? resolveSocketDir(config.socketDir) : undefined;
  // Resolved once no keeper answered the first PING: this start loads (warmRanks below).
  let onNoneAtStart!: () => void;
  const noKeeperAtStart = new Promise<void>((resolve) => (onNoneAtStart = resolve));
  const keeper =
    mode === 'off'
      ? undefined
      : new KeeperLink({ ...config.keeper, mode, socket: keeperSocketPath(config, socketDir!), log, onBack: () => actor.send({ type: 'KEEPER_BACK' }), onNoneAtStart });
  const keeperReady = keeper?.start();
  const input = { config, log, rankWorker, workers, servers, keeper: keeper && { socket: keeper.socket, ready: keeperReady! } };
  const actor = createActor(supervisorMachine.provide({ actors: nodeActors }), { input, inspect: feed.inspect });
  const status = () => statusOf(actor.getSnapshot(), config, servers, keeper);
  // The supervisor's top-level states, from the machine itself (the chart draws the same ones).
  const supervisorStates = Object.keys(supervisorMachine.root.states);
  const metrics = new NodeMetrics({ status, feed, states: () => supervisorStates });
  // Bound before the machine starts: a port in use fails the start in milliseconds. Loaded only
  // when asked for: the server, its page, every machine it draws and the chart drawing are no
  // part of serving.
  const { inspect } = config;
  const inspectServer = inspect
    ? await Promise.all([import('./inspect/inspectServer.js'), import('./machines/drawnMachines.js')])
        .then(([{ InspectServer }, { drawnChart, pageMachinesFor }]) => InspectServer.listen({ ...inspect, log, status, feed, metrics, charts: pageMachinesFor(config.nnodes).map(drawnChart) }))
        .catch(async (err: unknown) => {
          metrics.close();
          await keeper?.closeRefusedStart();
          if (socketDir) removeSocketDirIfCreated(socketDir);
          throw err;
        })
    : undefined;
  const control = new ModelControl({ actor, config, log, status, versions: (name) => modelStatuses(actor.getSnapshot(), servers, name), dropProcessed: (deviceUuid, base, key) => servers.dropProcessed(deviceUuid, base, key) });
  // A version a writer committed on a device socket is served through the model control, as a load is.
  servers.updates.publisher = (written) => control.publishUpdate(written);
  servers.updates.currentOf = (name) => control.currentOf(name);
  // A model whose checkpoint files changed is drained by the supervisor and loaded again here, once the node is ready.
  actor.on('MODEL_STALE', ({ spec }) => void ready.then(() => control.reload(spec), () => {}));
  // One that spans the group: node 0 has every node load it again (src/models/groupReload.ts).
  const groupReload = new GroupReload({ host: actor, versions: () => plannedVersions(actor.getSnapshot()), reload: (spec) => control.reload(spec, { group: true }), log });
  actor.on('MODEL_GROUP_RELOAD', ({ name, fingerprint, nodeRank }) => void ready.then(() => groupReload.reload(name, fingerprint, nodeRank), () => {}));
  const controlServer = config.control
    ? new ControlServer({ socketDir: socketDir!, log, limits: config.control.limits, target: { load: (r, o) => control.load(r, o), unload: (t, o) => control.unload(t, o), models: () => status().models, rollback: (n, v) => control.rollback(n, v) } })
    : undefined;
  await controlServer?.listen().catch(async (err: unknown) => {
    await inspectServer?.close();
    metrics.close();
    await keeper?.closeRefusedStart();
    if (socketDir) removeSocketDirIfCreated(socketDir);
    throw err;
  });
  const progress = config.progress ? new ProgressReporter({ log, status, feed, model: FIRST_MODEL_ID, intervalMs: config.progress.intervalMs, bar: config.progress.bar ? process.stderr : undefined }) : undefined;
  const listeners = new Set<(s: NodeStatus) => void>();

  let resolveReady!: (s: NodeStatus) => void;
  let rejectReady!: (e: Error) => void;
  const ready = new Promise<NodeStatus>((res, rej) => ((resolveReady = res), (rejectReady = rej)));
  // A caller that only awaits `done` must not see an unhandled rejection from `ready`.
  ready.catch(() => {});

  const restoreWritten = async (written: RestoredVersions | undefined) => {
    if (!written || written.models.length === 0) return;
    // Out of the supervisor's notification first: a load sent from inside it is taken only after it.
    await new Promise((resolve) => setImmediate(resolve));
    await control.restoreWritten(written);
  };

  let resolveDone!: (r: NodeResult) => void;
  const done = new Promise<NodeResult>((res) => (resolveDone = res));

  let lastState: string | undefined;
  const finish = async (result: NodeResult) => {
    control.close();
    controlServer?.close();
    await workers.drain();
    await keeper?.logHolding();
    await keeper?.close();
    // Locks a serve actor never took over (the node ended before serving); idempotent.
    for (const lock of actor.getSnapshot().context.prepared?.locks ?? []) lock.unlock();
    progress?.stop();
    await inspectServer?.close();
    metrics.close();
    if (result.failure) log.error({ code: result.failure.code, rank: result.failure.globalRank }, result.failure.message);
    log.info({ state: result.state }, 'node ended');
    await flushLogger(log);
    resolveDone(result);
  };

  actor.subscribe({
    next(snap) {
      // The node's state is the supervisor's (statusOf's `state`); the whole status, every model's
      // ranks and leases, is built only when it changed: a commit's publication alone moves the
      // supervisor through many snapshots.
      if (snap.value !== lastState) {
        const status = statusOf(snap, config, servers, keeper);
        lastState = status.state;
        log.debug({ state: status.state }, 'supervisor state');
        for (const l of listeners) l(status);
        // Warm threads no rank took are not needed once the node is ready.
        if (status.state === 'ready') workers.dropWarm();
        // Written versions the keeper held serve before the node says it is ready (ModelControl.restoreWritten).
        if (status.state === 'ready') void restoreWritten(snap.context.prepared?.written).then(() => resolveReady(statusOf(actor.getSnapshot(), config, servers, keeper)));
      }
      if (snap.status === 'done') {
        const failure = snap.context.failure;
        if (failure || snap.value === 'failed') {
          rejectReady(new RankFailedError(failure ? receivedCode(failure.code) : 'E_FAILED', failure?.message ?? 'node failed', { failure }));
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
      rejectReady(new WeightdError('E_INTERNAL', failure.message));
      void finish({ state: 'failed', failure });
    },
  });
  actor.start();
  // The ranks' threads load their modules while the node plans (src/actors/warmRankWorker.ts):
  // 100-140 ms of a start on the development VM, 150-200 ms on an H100 machine. Only once the
  // machine runs, whose end drains them: a start refused before (a port in use) leaves none.
  // Not where a keeper was already running: a restart then most likely adopts its ranks'
  // shards on this thread, with no worker at all.
  const warmRanks = () => {
    const threads = workers.warm(warmRankWorkerModule, config.localWorldSize, { warm: true } satisfies WarmRankWorkerData);
    if (threads > 0) log.debug({ threads }, `started ${threads} rank thread(s) warm`);
  };
  // With a keeper, once none answered the first PING: with spawn, not when the keeper it starts is
  // ready, tens of ms later (bench/RESULTS.md, issue 33).
  if (!keeper) warmRanks();
  else void noKeeperAtStart.then(warmRanks);

  return {
    config,
    log,
    ready,
    done,
    status,
    onStateChange(listener) {
      listeners.add(listener);
      listener(status());
      return () => listeners.delete(listener);
    },
    onEvent: (listener) => feed.subscribe(listener),
    recentEvents: () => feed.recent(),
    metrics: () => metrics.text(),
    get metricsRegistry() {
      return metrics.registry;
    },
    inspectUrl: inspectServer?.url,
    controlSocket: controlServer?.path,
    load: (request, options) => control.load(request, options),
    async unload(target, options) {
      return control.unload(target, options);
    },
    async stop(reason) {
      if (actor.getSnapshot().status === 'active') {
        log.info({ reason, from: actor.getSnapshot().value }, 'stopping');
        actor.send({ type: 'STOP', reason });
      }
      return done;
    },
  };
}

