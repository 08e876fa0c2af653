// Options for starting a node, validated once for both the CLI and the programmatic API, so a
// bad value fails in milliseconds, before minutes of loading. Messages name the CLI flag.
import { createServer } from 'node:net';
import { resolve } from 'node:path';
import type { ControlLimits } from './control/controlProtocol.js';
import type { Logger } from './log.js';
import { CUDA_HANDLES, type CudaHandles, type FillOptions } from './native/addon.js';
import { DIGESTS_ON_VARIABLE, FILL_SIZING } from './native/fillPolicy.js';
import { checkEvictionPolicy, type EvictionPolicy } from './models/evictionPolicy.js';
import { integer, usage } from './flagValues.js';
import { readModelsFile, resolveModelSpecs, type ModelRequest, type ModelSpec } from './models/modelSpecs.js';
import { DEFAULT_ADOPT_WITHIN_S, DEFAULT_INSPECT_HOST, DEFAULT_KEEP_VERSIONS, DEFAULT_PROCESSED_MAX_PERCENT } from './nodeDefaults.js';

export type DeviceChoice = 'auto' | 'cuda' | 'host';
/**
 * Where a rank's segments are kept beyond the daemon's life (docs/operations.md): `off`, not at
 * all; `spawn`, by a keeper the daemon starts when none answers (it outlives the daemon, and
 * ends once it holds nothing); `external`, by one the service manager runs (deploy/).
 */
export type KeeperMode = 'off' | 'spawn' | 'external';
export const KEEPER_MODES: readonly KeeperMode[] = ['off', 'spawn', 'external'];
export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';

/** What a caller may pass to startNode (and what the CLI builds from flags). */
export interface NodeOptions {
  /** Checkpoint directory (safetensors files, config.json): the node's own model. */
  model: string;
  /** Its name (default: the directory's name): what swaps, unloads and watches go by. */
  name?: string;
  tensorParallelSize?: number;
  /** Models served beside `model`, each with its own tp size (docs/operations.md, Several models). */
  models?: ModelRequest[];
  /** A JSON file listing every model, the node's own first (instead of `model` and `models`). */
  modelsFile?: string;
  nnodes?: number;
  nodeRank?: number;
  masterAddr?: string;
  /** The engine's own rendezvous port; only checked to differ from ours. */
  masterPort?: number;
  /** The daemon's rendezvous port, same on every node. Required when nnodes > 1. */
  weightCacheMasterPort?: number;
  /** Where the per-device sockets go; default a private per-user dir under the temp dir. */
  socketDir?: string;
  device?: DeviceChoice;
  /**
   * cuda: 'ipc' (default) allocates with cuMemAlloc and serves legacy CUDA IPC handles; 'fd'
   * allocates VMM memory and serves POSIX descriptors over the socket ("cuda-fd",
   * docs/protocol.md), which another process can keep alive. Default: 'fd' when a keeper is on
   * (a keeper can hold only descriptors), else 'ipc' (measured equal on the H200: open 0.30 ms
   * vs 0.36 ms, the same fill; ipc is what clients that cannot take descriptors need).
   */
  cudaHandles?: CudaHandles;
  logLevel?: LogLevel;
  /** Use this logger instead of creating one (programmatic use, tests). */
  logger?: Logger;
  /** A JSON sharding plan that overrides or extends the built-in rules. */
  planFile?: string;
  /** Layouts to serve besides `checkpoint` (always served): `vllm`. */
  layouts?: string[];
  /** Copy engine tuning. */
  fill?: Omit<FillOptions, 'group'>;
  /**
   * Keep the segments in a keeper process, so that a restarted daemon adopts them instead of
   * reading the checkpoint. `socket`: the keeper's socket (default `<socket dir>/keeper.sock`);
   * `adoptWithinS`: how long a keeper this daemon spawns holds segments nobody adopts.
   */
  keeper?: { mode?: KeeperMode; socket?: string; adoptWithinS?: number };
  /** How long to wait for every node at rendezvous. */
  rendezvousTimeoutMs?: number;
  /** Shared secret every node must present at rendezvous. */
  token?: string;
  /** Serve /healthz, /status, /metrics and /statechart over HTTP (port 0: any free port). */
  inspect?: { port?: number; host?: string };
  /**
   * Load progress: log lines every `intervalMs` (default 2000) while loading, and a bar on
   * stderr (default: when stderr is a TTY and no `logger` was passed); false: neither.
   */
  progress?: false | { intervalMs?: number; bar?: boolean };
  /**
   * The control socket (weightd ctl; docs/operations.md, Control socket): on unless false.
   * `limits` bounds its request rate (tests shrink it).
   */
  control?: false | { limits?: Partial<ControlLimits> };
  /**
   * What a load that does not fit beside the resident models may evict (docs/operations.md,
   * Eviction): 'off' (default) refuses it; 'no-lease-lru' unloads models with no lease, least
   * recently used first, just enough to make room, then loads. A load may ask for another.
   */
  evict?: EvictionPolicy;
  /**
   * How many versions of a model a writer's commits leave resident besides the current one
   * while no lease holds them (docs/weight-updates.md), for rollback without a reload. Default 2.
   */
  keepVersions?: number;
  /** Bytes engines may publish beside each rank of a version, as a percent of the rank's bytes (docs/engines.md). Default 100; 0 refuses publishing. */
  processedMaxPercent?: number;
}

/** Validated, complete configuration. */
export interface NodeConfig {
  /** Every model it serves from the start, its own first (the only one a group forms around). */
  models: [ModelSpec, ...ModelSpec[]];
  /** The group's tp size: its own model's, which the local ranks of every node add up to. */
  tpSize: number;
  nnodes: number;
  nodeRank: number;
  localWorldSize: number;
  masterAddr: string;
  masterPort?: number;
  weightCachePort: number;
  socketDir?: string;
  device: DeviceChoice;
  cudaHandles: CudaHandles;
  fill: FillOptions;
  keeper: { mode: KeeperMode; socket?: string; adoptWithinS: number };
  rendezvousTimeoutMs: number;
  token?: string;
  inspect?: { port: number; host: string };
  /** Absent or false: no progress reporting. */
  progress?: false | { intervalMs: number; bar: boolean };
  control: false | { limits?: Partial<ControlLimits> };
  evict: EvictionPolicy;
  keepVersions: number;
  processedMaxPercent: number;
}

export const DEFAULT_RENDEZVOUS_TIMEOUT_MS = 300_000;
export const DEFAULT_PROGRESS_INTERVAL_MS = 2000;

function port(flag: string, value: unknown): number {
  return integer(flag, value, 1, 65535, 'pass a TCP port number from 1 to 65535');
}

/** A free TCP port on loopback, for a single node that needs no agreed-on port. */
export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port: p } = srv.address() as { port: number };
      srv.close(() => resolvePort(p));
    });
  });
}

/** The node's models, from --models or from --model (repeated); the node's own first. */
function nodeModels(o: NodeOptions): ModelSpec[] {
  if (o.modelsFile === undefined) {
    return resolveModelSpecs([{ model: o.model, name: o.name, tensorParallelSize: o.tensorParallelSize, planFile: o.planFile, layouts: o.layouts }, ...(o.models ?? [])]);
  }
  const given = (['model', 'name', 'tensorParallelSize', 'planFile', 'models'] as const).filter((k) => o[k] !== undefined && o[k] !== '');
  if (given.length > 0) {
    throw usage('--models', o.modelsFile, `comes with ${given.join(', ')}`, 'give every model, with its tp size and plan file, in the --models file, or use --model without it');
  }
  return resolveModelSpecs(readModelsFile(o.modelsFile));
}

export async function resolveNodeOptions(o: NodeOptions): Promise<NodeConfig> {
  const models = nodeModels(o);
  const own = models[0]!;
  const tpSize = own.tpSize;
  const nnodes = integer('--nnodes', o.nnodes ?? 1, 1, 4096, 'pass the number of nodes, at least 1');
  if (tpSize % nnodes !== 0) {
    throw usage('--nnodes', nnodes, `does not divide --tensor-parallel-size ${tpSize}`, 'every node runs tp/nnodes ranks: choose nnodes that divides tp');
  }
  if (nnodes > 1 && models.length > 1) {
    // Its start-up is the group's (one rendezvous, one fingerprint); other models join a serving
    // group through their own model groups, which `weightd ctl load` starts.
    throw usage(
      '--model',
      models[1]!.modelDir,
      'is a second model, but a node of a group (--nnodes > 1) starts with one model',
      'start the group with its first model, then run weightd ctl load --model DIR on every node (docs/multi-node.md, "Models across nodes")',
    );
  }
  const nodeRank = integer('--node-rank', o.nodeRank ?? 0, 0, nnodes - 1, `pass this node's index, from 0 to nnodes-1 (${nnodes - 1})`);
  const masterPort = o.masterPort === undefined ? undefined : port('--master-port', o.masterPort);
  let weightCachePort: number;
  if (o.weightCacheMasterPort !== undefined) {
    weightCachePort = port('--weight-cache-master-port', o.weightCacheMasterPort);
    if (weightCachePort === masterPort) {
      throw usage('--weight-cache-master-port', weightCachePort, 'equals --master-port', "the daemon holds its port while it serves, so it must differ from the engine's --master-port");
    }
  } else if (nnodes > 1) {
    throw usage('--weight-cache-master-port', undefined, 'is required when --nnodes > 1', 'pass the same free port on every node, different from --master-port');
  } else {
    weightCachePort = await freePort();
  }
  const masterAddr = o.masterAddr ?? '127.0.0.1';
  if (typeof masterAddr !== 'string' || masterAddr.trim() === '') {
    throw usage('--master-addr', masterAddr, 'is empty', "pass node 0's address (a host name or IP) as the engine gets it");
  }
  const device = o.device ?? 'auto';
  if (!['auto', 'cuda', 'host'].includes(device)) throw usage('--device', device, 'is not a backend', 'use auto, cuda or host');
  const keeper = checkKeeper(o.keeper ?? {});
  const cudaHandles = o.cudaHandles ?? (keeper.mode === 'off' ? 'ipc' : 'fd');
  if (!CUDA_HANDLES.includes(cudaHandles)) throw usage('--cuda-handles', cudaHandles, 'is not a kind of CUDA handle', `use ${CUDA_HANDLES.join(' or ')} (default: fd with a keeper, else ipc)`);
  const rendezvousTimeoutMs = checkRendezvousTimeout(o.rendezvousTimeoutMs ?? DEFAULT_RENDEZVOUS_TIMEOUT_MS);
  const inspect = o.inspect === undefined ? undefined : checkInspect(o.inspect, [o.weightCacheMasterPort === undefined ? undefined : weightCachePort, masterPort]);
  return {
    models: [own, ...models.slice(1)],
    tpSize,
    nnodes,
    nodeRank,
    localWorldSize: tpSize / nnodes,
    masterAddr,
    masterPort,
    weightCachePort,
    socketDir: o.socketDir === undefined ? undefined : resolve(o.socketDir),
    device,
    cudaHandles,
    fill: checkFill(o.fill ?? {}),
    keeper,
    rendezvousTimeoutMs,
    token: o.token,
    inspect,
    progress: checkProgress(o.progress, o.logger !== undefined),
    control: o.control ?? {},
    evict: checkEvictionPolicy('--evict', o.evict ?? 'off'),
    keepVersions: integer('--keep-versions', o.keepVersions ?? DEFAULT_KEEP_VERSIONS, 0, 64, `pass how many earlier versions of a model to keep for rollback, from 0 to 64 (default ${DEFAULT_KEEP_VERSIONS})`),
    processedMaxPercent: integer(
      '--processed-max-percent',
      o.processedMaxPercent ?? DEFAULT_PROCESSED_MAX_PERCENT,
      0,
      1000,
      `pass the bytes engines may publish beside a rank, as a percent of its bytes, from 0 (none) to 1000 (default ${DEFAULT_PROCESSED_MAX_PERCENT})`,
    ),
  };
}

/** The flag is in seconds (rendezvousTimeoutMs is the API's milliseconds): report it in seconds. */
function checkRendezvousTimeout(ms: unknown): number {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 1 || ms > 86_400_000) {
    throw usage('--rendezvous-timeout', typeof ms === 'number' ? ms / 1000 : ms, 'must be a number of seconds from 0.001 to 86400', 'pass how long to wait for every node, in seconds (default 300)');
  }
  return Math.round(ms);
}

/** --load-threads: the addon refuses more (native/fill_args.cpp kMaxThreads). --staging-mb: more than 16 GiB per rank is a typo. */
export const MAX_LOAD_THREADS = 256;
export const MAX_STAGING_MIB = 16_384;

function checkFill(f: NonNullable<NodeOptions['fill']>): NodeConfig['fill'] {
  const out = { ...f };
  if (f.threads !== undefined) out.threads = integer('--load-threads', f.threads, 1, MAX_LOAD_THREADS, `pass the reader threads per rank, from 1 to ${MAX_LOAD_THREADS} (default ${FILL_SIZING.threads})`);
  if (f.stagingBytes !== undefined) {
    out.stagingBytes = integer('--staging-mb', f.stagingBytes / 2 ** 20, 1, MAX_STAGING_MIB, `pass the pinned staging MiB per rank, from 1 to ${MAX_STAGING_MIB} (default ${FILL_SIZING.stagingBytes / 2 ** 20})`) * 2 ** 20;
  }
  // The fill, a writer's commit and an engine's publish on cuda all hash where this says: refused here, before any of them.
  if (f.digestOn !== undefined && f.digestOn !== 'gpu' && f.digestOn !== 'cpu') {
    throw usage('fill.digestOn', f.digestOn, 'is not where digests are hashed', `pass 'gpu' or 'cpu', or leave it out for ${DIGESTS_ON_VARIABLE} (default gpu)`);
  }
  return out;
}

function checkKeeper(k: NonNullable<NodeOptions['keeper']>): NodeConfig['keeper'] {
  const mode = k.mode ?? 'off';
  if (!KEEPER_MODES.includes(mode)) throw usage('--keeper', mode, 'is not a keeper mode', `use ${KEEPER_MODES.join(', ')}`);
  if (k.socket !== undefined && (typeof k.socket !== 'string' || k.socket === '')) {
    throw usage('--keeper-socket', k.socket, 'is empty', "pass the keeper's socket path (default <socket dir>/keeper.sock)");
  }
  if ((k.socket !== undefined || k.adoptWithinS !== undefined) && mode === 'off') {
    throw usage(k.socket !== undefined ? '--keeper-socket' : '--adopt-within', k.socket ?? k.adoptWithinS, 'has no effect with --keeper off', 'pass --keeper spawn or --keeper external too');
  }
  if (k.adoptWithinS !== undefined && mode === 'external') {
    throw usage('--adopt-within', k.adoptWithinS, 'applies only to a keeper this daemon spawns', "set it on the keeper's own command line (weightd keeper --adopt-within)");
  }
  const adoptWithinS = integer('--adopt-within', k.adoptWithinS ?? DEFAULT_ADOPT_WITHIN_S, 1, 30 * 86_400, `pass seconds from 1 to ${30 * 86_400} (default ${DEFAULT_ADOPT_WITHIN_S})`);
  return { mode, socket: k.socket === undefined ? undefined : resolve(k.socket), adoptWithinS };
}

/** `taken`: the rendezvous ports (ours and the engine's), which the inspect server must not take. */
function checkInspect(i: NonNullable<NodeOptions['inspect']>, taken: Array<number | undefined>): NonNullable<NodeConfig['inspect']> {
  if (i.port === undefined) throw usage('--inspect-port', undefined, 'is required with --inspect-host', 'pass the port for the inspect server too');
  const p = integer('--inspect-port', i.port, 0, 65535, 'pass a TCP port number from 1 to 65535 (0: any free port)');
  if (p !== 0 && taken.includes(p)) {
    throw usage('--inspect-port', p, 'equals a rendezvous port (--weight-cache-master-port, or the engine\'s --master-port)', 'choose another port for the inspect server');
  }
  const host = i.host ?? DEFAULT_INSPECT_HOST;
  if (typeof host !== 'string' || host.trim() === '') throw usage('--inspect-host', host, 'is empty', `pass an address to bind, such as ${DEFAULT_INSPECT_HOST} (the default)`);
  return { port: p, host };
}

/** A caller that brings its own logger owns the terminal too: no bar unless asked for. */
function checkProgress(p: NodeOptions['progress'], ownLogger: boolean): NodeConfig['progress'] {
  if (p === false) return false;
  const intervalMs = integer('progress.intervalMs', p?.intervalMs ?? DEFAULT_PROGRESS_INTERVAL_MS, 100, 3_600_000, 'pass milliseconds from 100 to 3600000');
  return { intervalMs, bar: p?.bar ?? (Boolean(process.stderr.isTTY) && !ownLogger) };
}
