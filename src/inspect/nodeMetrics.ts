// Prometheus metrics of one node, in a Registry of its own (never prom-client's global one, so
// that two nodes in one process, or a host program's own metrics, never collide). Gauges are
// read from the node's status when scraped; errors are counted as their events happen.
// prom-client is loaded, and the registry built, on first use (a scrape, or a host program asking
// for the registry): a node that is never scraped never loads it, which saves its start the
// module load. The error counts are kept from the start, so the first scrape misses none.
import { createRequire } from 'node:module';
import type { Gauge, Registry } from 'prom-client';
import type { NodeStatus } from '../nodeStatus.js';
import type { EventFeed } from './eventFeed.js';
import { toStatusView, type ProcessedLayoutView, type RankView, type StatusView } from './statusView.js';

export interface NodeMetricsOptions {
  status: () => NodeStatus;
  feed: EventFeed;
  /** Every state the supervisor machine has (weightd_node_state has one series per state); asked when the registry is built. */
  states: () => readonly string[];
}

const RANK_LABELS = ['global_rank', 'local_rank'] as const;

function rankLabels(r: RankView): Record<(typeof RANK_LABELS)[number], string> {
  return { global_rank: String(r.globalRank), local_rank: String(r.localRank) };
}

export class NodeMetrics {
  readonly #o: NodeMetricsOptions;
  /** Failures the supervisor received, by error code, since the node started. */
  readonly #errors = new Map<string, number>();
  readonly #unsubscribe: () => void;
  #registry: Registry | undefined;

  constructor(o: NodeMetricsOptions) {
    this.#o = o;
    this.#unsubscribe = o.feed.subscribe((e) => {
      // Only what the supervisor received, and a model's failure as its registry received it: the
      // NODE_FAILED it passes on to the group repeats it, a model's MODEL_FAILED repeats its rank's
      // RANK_FAILED, and the registry's other events are the supervisor's passed on.
      if (e.to !== undefined || e.model !== undefined || (e.registry && e.type !== 'MODEL_FAILED')) return;
      const error = e.data.error as { code?: string } | undefined;
      if (error?.code !== undefined) this.#errors.set(error.code, (this.#errors.get(error.code) ?? 0) + 1);
    });
  }

  /** The node's own Registry, built on first use. */
  get registry(): Registry {
    return (this.#registry ??= this.#build());
  }

  #build(): Registry {
    // prom-client is CommonJS, so it loads synchronously here, where the getter needs it.
    const { Counter, Gauge, Registry } = createRequire(import.meta.url)('prom-client') as typeof import('prom-client');
    const o = this.#o;
    const registry = new Registry();
    const view = (): StatusView => toStatusView(o.status());
    const registers = [registry];
    /** A gauge whose series are set from the status at each scrape, and only those. */
    const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[], fill: (g: Gauge<L>, v: StatusView) => void) =>
      new Gauge<L>({
        name,
        help,
        labelNames,
        registers,
        collect() {
          this.reset();
          fill(this, view());
        },
      });
    const perRank = (name: string, help: string, value: (r: RankView) => number | null) =>
      gauge(name, help, RANK_LABELS, (g, v) => {
        for (const r of v.ranks) {
          const n = value(r);
          // An unknown value has no series, rather than a made-up 0.
          if (n !== null) g.set(rankLabels(r), n);
        }
      });

    gauge('weightd_node_info', 'The node: always 1, with what it serves as labels.', ['node_rank', 'nnodes', 'tp_size', 'model', 'architecture', 'fingerprint'], (g, v) =>
      g.set({ node_rank: String(v.nodeRank), nnodes: String(v.nnodes), tp_size: String(v.tpSize), model: v.model, architecture: v.architecture ?? '', fingerprint: v.fingerprint ?? '' }, 1),
    );
    gauge('weightd_node_state', 'Supervisor state: 1 for the current one, 0 for the others.', ['state'], (g, v) => {
      for (const s of o.states()) g.set({ state: s }, s === v.state ? 1 : 0);
    });
    gauge('weightd_node_ready', "1 while the node's own model serves on every one of its ranks (what /healthz reports).", [], (g, v) => g.set(v.ready ? 1 : 0));
    gauge('weightd_group_ready', '1 once every node of the group has reported ready.', [], (g, v) => g.set(v.groupReady ? 1 : 0));
    gauge('weightd_rank_state', 'Rank state: 1, with the state as a label (one series per rank).', [...RANK_LABELS, 'state'], (g, v) => {
      for (const r of v.ranks) g.set({ ...rankLabels(r), state: r.state }, 1);
    });
    perRank('weightd_rank_loaded_bytes', 'Bytes of the rank shard resident on its device.', (r) => r.bytes);
    gauge('weightd_rank_resident_bytes', 'Bytes of the rank shard resident, by where they came from: read from the checkpoint, or adopted from a keeper.', [...RANK_LABELS, 'source'], (g, v) => {
      for (const r of v.ranks) if (r.source !== null) g.set({ ...rankLabels(r), source: r.source }, r.bytes);
    });
    perRank('weightd_rank_kept', 'With a keeper: 1 while it holds the rank shard, 0 while it does not (absent without a keeper).', (r) => (r.kept === null ? null : r.kept ? 1 : 0));
    perRank('weightd_rank_descriptors_checked', 'A cuda rank adopted with no CUDA context (a restart\'s fast path): 0 while its descriptors\' check runs (no client gets them yet), 1 once passed (absent where every check ran before it was loaded; a failed check fails the rank).', (r) => (r.descriptors === null ? null : r.descriptors === 'checked' ? 1 : 0));
    perRank('weightd_rank_waiting_for_group', 'While a rank loads: 1 while it waits for the node\'s other ranks of its model (its fill group), 0 while it reads; absent when not loading.', (r) => (r.state === 'loading' ? (r.waitingForGroup ? 1 : 0) : null));
    perRank('weightd_rank_kept_age_seconds', 'An adopted rank: how long its segments had been kept when this daemon adopted them.', (r) => (r.keptAgeMs === null ? null : r.keptAgeMs / 1000));
    gauge('weightd_keeper_up', 'With a keeper: 1 while it answers, 0 while it is absent or lost (absent with --keeper off).', [], (g, v) => {
      if (v.keeper) g.set(v.keeper.state === 'up' ? 1 : 0);
    });
    perRank('weightd_rank_total_bytes', 'Bytes of the rank shard in the load plan.', (r) => r.totalBytes);
    perRank('weightd_rank_load_seconds', 'Seconds the rank has spent loading (the whole load, once resident).', (r) => r.seconds);
    perRank('weightd_rank_load_bytes_per_second', 'Average load rate of the rank.', (r) => r.bytesPerSecond);
    perRank('weightd_rank_clients', 'Client connections on the rank socket (absent while not known).', (r) => r.clients);
    perRank('weightd_rank_leases', 'Leases held on the rank memory (absent while not known).', (r) => r.leases);
    gauge('weightd_model_version', 'Each model version resident: its number among its name\'s versions (0: a checkpoint; N+1 per writer\'s commit), current 1 for the one clients are pointed to.', ['model', 'fingerprint', 'current'], (g, v) => {
      for (const m of v.models) if (m.state === 'serving' || m.state === 'draining') g.set({ model: m.name, fingerprint: m.fingerprint ?? '', current: m.current ? '1' : '0' }, m.version);
    });
    // One series per processed layout, of every model version: they come and go with publishes,
    // drops to make room and their versions, so no layout's series outlives it.
    const PROCESSED_LABELS = ['model', 'version', 'global_rank', 'key'] as const;
    const perProcessed = (name: string, help: string, value: (p: ProcessedLayoutView) => number) =>
      gauge(name, help, PROCESSED_LABELS, (g, v) => {
        for (const m of v.models) {
          for (const r of m.ranks) for (const p of r.processed ?? []) g.set({ model: m.name, version: String(m.version), global_rank: String(r.globalRank), key: p.key }, value(p));
        }
      });
    perProcessed('weightd_processed_layout_bytes', 'Bytes of a processed layout an engine published beside a rank of a model version (docs/engines.md).', (p) => p.bytes);
    perProcessed('weightd_processed_layout_leases', 'Engines that map a processed layout now (its get_processed leases); one with none may be dropped to make room for a load.', (p) => p.leases);
    perProcessed('weightd_processed_layout_published_timestamp_seconds', 'When a processed layout was published, seconds since the epoch.', (p) => Date.parse(p.publishedAt) / 1000);
    gauge('weightd_peer_up', 'Other nodes of the group: 1 up, 0 reported lost.', ['node_rank'], (g, v) => {
      for (const p of v.peers) g.set({ node_rank: String(p.nodeRank) }, p.state === 'up' ? 1 : 0);
    });

    const errors = this.#errors;
    new Counter({
      name: 'weightd_errors_total',
      help: 'Failures reported to the supervisor, by error code.',
      labelNames: ['code'],
      registers,
      collect() {
        this.reset();
        for (const [code, n] of errors) this.inc({ code }, n);
      },
    });
    return registry;
  }

  /** The Prometheus text exposition. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  close(): void {
    this.#unsubscribe();
  }
}
