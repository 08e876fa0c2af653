// Command-line flags, named as the inference engines name them so one set of values can feed
// both. Parsing only: validation is resolveNodeOptions', shared with the programmatic API.
// The default command runs the daemon; `weightd statechart` prints the supervisor's chart and
// `weightd fingerprint` the fingerprints a client should expect; `weightd keeper` runs the keeper.
import { Command, CommanderError, Option } from 'commander';
import { resolve } from 'node:path';
import type { ControlCommand, ControlRequest } from '../control/controlProtocol.js';
import { UsageError } from '../errors.js';
import type { VerifyWrittenRequest } from './verifyWritten.js';
import { EVICTION_POLICIES, type EvictionPolicy } from '../models/evictionPolicy.js';
import { CTL_COMMANDS } from './ctl/index.js';
import type { CtlCommand } from './ctl/ctlCommand.js';
import { integer, num, versionNumber } from '../flagValues.js';
import { VERSION } from '../version.js';
import { FILL_SIZING } from '../native/fillPolicy.js';
import type { NodeOptions } from '../nodeOptions.js';
import { DEFAULT_ADOPT_WITHIN_S, DEFAULT_INSPECT_HOST, DEFAULT_KEEP_VERSIONS, DEFAULT_PROCESSED_MAX_PERCENT } from '../nodeDefaults.js';
import type { FingerprintRequest } from './printFingerprints.js';
import type { VerifyRequest } from './runVerify.js';
import { keeperSocketPath } from '../keeper/keeperSocketPath.js';
import { defaultSocketDir } from '../wire/socketDir.js';
import { DRAWN_MACHINE_NAMES, type DrawnMachine } from '../machines/drawnMachineNames.js';

export { VERSION };

/** Engines spell the tensor-parallel short flag `-tp`, which commander would read as `-t -p`. */
function expandShortFlags(argv: string[]): string[] {
  return argv.flatMap((a) => (a === '-tp' ? ['--tensor-parallel-size'] : a.startsWith('-tp=') ? [`--tensor-parallel-size=${a.slice(4)}`] : [a]));
}

/**
 * Spellings of a flag that other tools use, which commander's edit-distance suggestion cannot
 * reach (`--tp` is too far from `--tensor-parallel-size`).
 */
const OTHER_SPELLINGS: Record<string, string> = {
  '--tp': '--tensor-parallel-size or -tp',
  '--tensor-parallel': '--tensor-parallel-size or -tp',
  '--tp-size': '--tensor-parallel-size or -tp',
  '--model-dir': '--model',
  '--model-path': '--model',
};

const HELP_AFTER = `
Examples:
  weightd --model ./llama-3-8b -tp 2                  one node, two GPUs
  weightd --model ./llama-3-8b -tp 2 --device host    no GPU: shards in host memory
  weightd --model /models/llama-3-70b -tp 16 --nnodes 2 --node-rank 0 \\
      --master-addr 10.0.0.1 --weight-cache-master-port 29600    node 0 of 2 (docs/multi-node.md)
  weightd fingerprint --model ./llama-3-8b -tp 2      what a client should expect
  weightd verify --model ./llama-3-8b -tp 2           does the running daemon hold exactly the files' bytes?
  weightd statechart > supervisor.mmd                 the supervisor's state chart
  weightd statechart --machine coordinator           node 0's rendezvous coordinator
  weightd keeper --socket /run/weightd/keeper.sock    the keeper that holds memory across restarts (docs/keeper.md)
  weightd ctl list --weight-cache-socket-dir /run/weightd     the models a running daemon serves
  weightd keeper status --weight-cache-socket-dir /run/weightd   what its keeper holds, until when

Exit codes:
  0  stopped by SIGTERM, SIGINT, SIGHUP or SIGQUIT (after a clean stop)
  1  failed at run time: a rank, the rendezvous, a device or the checkpoint (the log says which)
  2  bad flags, or flags the checkpoint or machine cannot satisfy (a tp size the model's shapes
     do not divide, --device cuda without a driver, --cuda-handles fd on GPUs that cannot export
     descriptors): restarting cannot help
  A start never ends by a signal, except when a thread is still blocked in the kernel 2 s after
  the stop (a hung network filesystem): then by the stop signal, or SIGKILL after a failure

Environment:
  WEIGHTD_TOKEN                  the rendezvous secret, if --weight-cache-token is not given
  WEIGHTD_HOST_DEVICES           host backend: comma-separated device ids (its CUDA_VISIBLE_DEVICES)
  CUDA_VISIBLE_DEVICES           cuda backend: which GPUs this node uses
  TMPDIR                         where the default socket dir goes ($TMPDIR/weightd-<uid>)
  WEIGHTD_RDZV_HEARTBEAT_MS, WEIGHTD_RDZV_PEER_TIMEOUT_MS, WEIGHTD_RDZV_RETRY_MIN_MS,
  WEIGHTD_RDZV_RETRY_MAX_MS, WEIGHTD_RDZV_HANDSHAKE_MS, WEIGHTD_RDZV_JOIN_MS
                                 rendezvous clocks, in milliseconds
  WEIGHTD_SERVE_READ_TIMEOUT_MS, WEIGHTD_SERVE_IDLE_TIMEOUT_MS, WEIGHTD_SERVE_LEASE_SWEEP_MS,
  WEIGHTD_SERVE_MAX_CONNECTIONS, WEIGHTD_SERVE_LOG_WINDOW_MS, WEIGHTD_SERVE_MAX_WATCHERS,
  WEIGHTD_SERVE_EVENT_READ_TIMEOUT_MS
                                 socket server limits (docs/protocol.md, Limits)
  WEIGHTD_SERVE_FILES_CHECK_MS   how long a check that a model's checkpoint files are unchanged
                                 stands before a get_state stats them again (default 1000; 0: always)
  WEIGHTD_FILL_DIGESTS_ON        cuda: where a fill, a writer's commit and verify hash content digests, gpu (default; the CPU where the kernel is missing) or cpu
                                 (a fill's GPU digests equalled the CPU's on an H200 on 2026-12-05: docs/operations.md)
`;

/** What running weightd with no model says: the usage, with an example to copy. */
export const NO_MODEL_USAGE =
  'weightd needs a checkpoint to serve: weightd --model DIR [-tp N] [flags], or weightd --models FILE; ' +
  'for example: weightd --model examples/tiny-llama --device host; run weightd --help for every flag and command';

/** Commander's message, on one line, with what it does not know to suggest. */
function usageMessage(err: CommanderError, program: Command, failed: Command): string {
  let message = err.message.replace(/^error: /, '').replace(/\s*\n\s*/g, ' ');
  const unknown = /^unknown option '([^']+)'/.exec(message)?.[1]?.split('=')[0];
  const other = unknown && OTHER_SPELLINGS[unknown];
  if (other) message += ` (Did you mean ${other}?)`;
  // A flag that exists, on another command, is not unknown: say where it belongs.
  const owners = unknown === undefined ? [] : commandsOf(program).filter((c) => c.options.some((o) => o.long === unknown || o.short === unknown));
  if (owners.length > 0) message = `${unknown} is not a flag of ${fullName(failed)}: it is one of ${owners.map(fullName).join(', ')}`;
  // The daemon's own operands (a subcommand's excess ones are its own business).
  if (err.code === 'commander.excessArguments' && failed === program) {
    const positional = program.args[0];
    if (positional !== undefined) {
      message =
        (program.opts().model as string[]).length === 0
          ? `${JSON.stringify(positional)}: weightd takes the checkpoint directory as --model ${positional}, not as an argument`
          : `${JSON.stringify(positional)}: weightd takes no arguments besides its flags (quote a value that has spaces)`;
    }
  }
  return `${message}; run ${fullName(failed)} --help for ${failed === program ? 'every flag' : 'its flags'}`;
}

/**
 * The daemon's flags that its other commands share, one definition each. A factory, since
 * commander keeps each option's parsed value on the Option object's command.
 */
const SHARED_FLAGS = [() => new Option('--weight-cache-socket-dir <dir>', "the socket directory: the per-device sockets, the control socket and the keeper's (default: a private per-user dir under the temp dir)")];

/** A subcommand whose help ends with examples of it. */
function subcommand(parent: Command, name: string, description: string, examples: string[]): Command {
  const heading = examples.length === 1 ? 'Example' : 'Examples';
  return parent.command(name).description(description).addHelpText('after', `\n${heading}:\n${examples.map((e) => `  ${e}\n`).join('')}`);
}

/** A command and every command under it. */
function commandsOf(c: Command): Command[] {
  return [c, ...c.commands.flatMap(commandsOf)];
}

/** `weightd ctl load`: a command's name as typed. */
function fullName(c: Command): string {
  return c.parent ? `${fullName(c.parent)} ${c.name()}` : c.name();
}

export type ChartFormat = 'mermaid' | 'json';

/** What the command line asks for. */
export type CliCommand =
  | { command: 'run'; options: NodeOptions }
  | { command: 'statechart'; format: ChartFormat; machine: DrawnMachine }
  | { command: 'fingerprint'; request: FingerprintRequest }
  /** Compares a running daemon's full digests with the checkpoint on disk (src/cli/runVerify.ts). */
  | { command: 'verify'; request: VerifyRequest }
  | { command: 'verifyWritten'; request: VerifyWrittenRequest }
  /** Sends one request to a running daemon's control socket. */
  | { command: 'ctl'; request: ControlRequest; control?: string; socketDir?: string; json: boolean }
  /** Runs weightd-keeper with these arguments (its own flags, checked by it). */
  | { command: 'keeper'; args: string[] }
  /** Asks the keeper at `socket` what it holds, or stops it. */
  | { command: 'keeperAsk'; action: 'status' | 'stop'; socket: string; json: boolean }
  /** --help or --version: print `text` and exit 0. */
  | { command: 'print'; text: string };

export function buildProgram(): Command {
  const program = new Command('weightd')
    .description('GPU weight cache daemon: loads a safetensors checkpoint once and serves each tensor-parallel shard over a Unix socket')
    .version(VERSION, '--version')
    .option('--model <dir>', 'checkpoint directory (safetensors + config.json); repeat it to serve several models (the first is the node\'s own)', collect, [])
    .option('--tensor-parallel-size <n>', 'tensor-parallel size, all nodes together (also -tp <n>); once for every --model, or once per --model in their order', collect, [])
    .option('--models <file>', 'a JSON file listing every model to serve, with names and tp sizes (docs/operations.md, Several models), instead of --model')
    .option('--nnodes <n>', 'number of nodes', '1')
    .option('--node-rank <r>', "this node's index, 0..nnodes-1", '0')
    .option('--master-addr <addr>', "node 0's address (the engine's value)", '127.0.0.1')
    .option('--master-port <port>', "the engine's rendezvous port (checked to differ from ours)")
    .option('--weight-cache-master-port <port>', "the daemon's own rendezvous port, same on every node (required with --nnodes > 1)")
    .option('--weight-cache-token <token>', 'shared secret for multi-node rendezvous (or env WEIGHTD_TOKEN)')
    .option('--rendezvous-timeout <seconds>', 'how long to wait for every node', '300')
    .addOption(new Option('--device <backend>', 'device backend').choices(['auto', 'cuda', 'host']).default('auto'))
    .addOption(
      new Option('--cuda-handles <kind>', 'cuda: how segments are shared; ipc: cuMemAlloc + legacy CUDA IPC handles; fd: VMM memory passed as file descriptors over the socket (docs/protocol.md). Default: fd with --keeper spawn|external (only descriptors can be kept), else ipc')
        .choices(['ipc', 'fd']),
    )
    .option('--plan-file <file>', 'JSON sharding plan overriding the built-in rules')
    .option('--layouts <names>', 'layouts to serve, comma-separated: checkpoint (always) and vllm (engine parameter names; docs/sharding.md)', 'checkpoint')
    .option('--staging-mb <mib>', `pinned staging memory for the copy engine, per rank (cuda; default ${FILL_SIZING.stagingBytes / 2 ** 20}; a node's GPUs share one pool)`)
    .option('--load-threads <n>', `reader threads per rank (default ${FILL_SIZING.threads}; a node's GPUs share one pool)`)
    .addOption(new Option('--direct-io <mode>', 'cuda: read the checkpoint with O_DIRECT; auto does when the page cache holds less than half of it').choices(['auto', 'on', 'off']).default('auto'))
    .addOption(new Option('--keeper <mode>', 'keep the shards beyond the daemon, so a restart adopts them without reading the checkpoint: off, spawn (start a keeper when none runs) or external (one run by systemd or Kubernetes; docs/operations.md)').choices(['off', 'spawn', 'external']).default('off'))
    .option('--keeper-socket <path>', "the keeper's socket (default: keeper.sock in the socket dir)")
    .option('--adopt-within <seconds>', `how long a keeper this daemon spawns holds shards no daemon adopts (default ${DEFAULT_ADOPT_WITHIN_S})`)
    .addOption(new Option('--evict <policy>', 'what a load that does not fit beside the resident models may evict: off (refuse it), or no-lease-lru (unload models with no lease, least recently used first, just enough; docs/operations.md, Eviction)').choices(EVICTION_POLICIES).default('off'))
    .option('--keep-versions <n>', 'how many earlier versions of a model a writer\'s commits leave resident for rollback while no lease holds them (docs/weight-updates.md)', String(DEFAULT_KEEP_VERSIONS))
    .option('--processed-max-percent <n>', `bytes engines may publish beside each rank of a version (processed layouts, docs/engines.md), as a percent of that rank's bytes; 0 refuses publishing`, String(DEFAULT_PROCESSED_MAX_PERCENT))
    .addOption(new Option('--log-level <level>', 'log level').choices(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info'))
    .option('--inspect-port <port>', 'serve /healthz, /status, /metrics and the live /statechart page on this HTTP port (0: any free port)')
    .option('--inspect-host <addr>', `address for the inspect server (default: ${DEFAULT_INSPECT_HOST}); anything but loopback exposes it to the network`)
    .addHelpText('after', HELP_AFTER)
    // The daemon's flags stop at a subcommand's name, so `weightd fingerprint --model` is its own.
    .enablePositionalOptions();
  program
    .command('statechart')
    .description("print a machine's state chart (default: the supervisor's), drawn from the machine itself, without starting a node")
    .addOption(new Option('--format <format>', 'mermaid (stateDiagram-v2) or json').choices(['mermaid', 'json']).default('mermaid'))
    .addOption(new Option('--machine <machine>', "supervisor (the node), coordinator (node 0's rendezvous), groupMember (a node's membership of its group), rankService (a rank's serving lifecycle), rankWorker (a rank's worker thread), model (each model the node serves) or modelGroup (node 0's commit of a model across the group)").choices(DRAWN_MACHINE_NAMES).default('supervisor'));
  program
    .command('fingerprint')
    .description('print, as JSON, the fingerprint of every rank of a checkpoint as the daemon computes it (for clients to send with get_state)')
    .option('--model <dir>', 'checkpoint directory')
    .option('--tensor-parallel-size <n>', 'tensor-parallel size (also -tp <n>)', '1')
    .option('--plan-file <file>', 'JSON sharding plan, as given to the daemon');
  const verify = subcommand(program, 'verify', "hash every tensor of a checkpoint on disk and compare it, tensor by tensor, with what a running daemon holds (its full digests); exit 0 equal, 1 a tensor differs, 2 bad flags, 3 nothing to compare with (checkpoint unplannable, no daemon, version or digests) (docs/operations.md, Verifying)", ['weightd verify --model /models/llama-3-8b -tp 2 --weight-cache-socket-dir /run/weightd'])
    .option('--model <dir>', 'checkpoint directory')
    .option('--tensor-parallel-size <n>', 'tensor-parallel size (also -tp <n>)', '1')
    .option('--plan-file <file>', 'JSON sharding plan, as given to the daemon')
    .option('--global-rank <r>', 'the rank whose socket to ask (default: the first this node serves)')
    .option('--name <name>', "with --version: the model whose version a writer committed (it has no files: its tensors are digested in the daemon's memory and compared with the digests its commit recorded)")
    .option('--version <n>', 'with --name: the number of the written version to verify (weightd ctl list shows them)');
  const ctl = subcommand(program, 'ctl', "control a running daemon through its control socket (same user only): load, unload and list models (docs/operations.md, Control socket)", ['weightd ctl list --weight-cache-socket-dir /run/weightd']);
  for (const [name, entry] of Object.entries(CTL_COMMANDS)) entry.flags(subcommand(ctl, name, entry.description, entry.examples));
  const keeper = subcommand(program, 'keeper', "run weightd-keeper, the process that holds the memory's descriptors while daemons come and go (docs/keeper.md); or, with status or stop, ask the one at the socket", [
    'weightd keeper --socket /run/weightd-keeper/keeper.sock',
    'weightd keeper status --weight-cache-socket-dir /run/weightd',
  ])
    .option('--adopt-within <seconds>', 'free a record this long after its owner exits, unless a daemon takes it', '600')
    .option('--exit-when-empty', 'exit once it holds nothing and nobody is connected')
    .option('--request-timeout <seconds>', "close a connection whose request has not arrived whole this long after its first byte, or whose reply is not taken this long after it is ready (the keeper's default: 10; docs/keeper.md, Bounds)")
    .option('--idle-timeout <seconds>', "close a connection that sent nothing this long since it connected or took its last reply (the keeper's default: 30)")
    .addOption(new Option('--log-level <level>', 'log level').choices(['debug', 'info', 'warn', 'error']).default('info'));
  subcommand(keeper, 'status', 'say whether a keeper answers at the socket, and what it holds: each shard, its bytes, its owner and when it is freed', ['weightd keeper status --weight-cache-socket-dir /run/weightd']);
  subcommand(keeper, 'stop', 'stop the keeper at the socket (SIGTERM): it frees everything it holds', ['weightd keeper stop --socket /run/weightd-keeper/keeper.sock']);
  for (const c of commandsOf(keeper)) c.option('--socket <path>', "the keeper's socket (default: keeper.sock in the socket dir, which must be yours and not group/other-writable)");
  // The shared flags, on every command that finds the daemon or its keeper by the socket
  // directory: they may stand before or after a subcommand's name (parseCommand merges them).
  for (const c of [program, verify, ...commandsOf(ctl), ...commandsOf(keeper)]) for (const flag of SHARED_FLAGS) c.addOption(flag());
  for (const c of commandsOf(program)) c.helpOption('-h, --help', 'show this help');
  for (const c of [ctl, ...ctl.commands]) c.option('--control <socket>', "the daemon's control socket (default: the one live in the socket directory)");
  for (const c of [...ctl.commands, ...keeper.commands]) c.option('--json', 'print JSON (for scripts) instead of text');
  return program;
}

/**
 * A subcommand's options, with those given before its name (`weightd --weight-cache-socket-dir
 * S ctl list`): the nearest wins. A flag given before the name that the subcommand does not take
 * is refused, never ignored.
 */
function optionsOf(leaf: Command): Record<string, unknown> {
  const merged: Record<string, unknown> = { ...leaf.opts() };
  const given = new Set(Object.keys(merged).filter((k) => leaf.getOptionValueSource(k) === 'cli'));
  for (let c = leaf.parent; c; c = c.parent) {
    for (const option of c.options) {
      const key = option.attributeName();
      if (c.getOptionValueSource(key) !== 'cli') continue;
      if (!leaf.options.some((o) => o.attributeName() === key)) {
        throw new UsageError('E_USAGE', `${option.long} is a flag of ${fullName(c)}, not of ${fullName(leaf)}; run ${fullName(leaf)} --help for its flags`);
      }
      if (!given.has(key)) merged[key] = c.getOptionValue(key);
      given.add(key);
    }
  }
  return merged;
}

/** Parses argv (without node and script). Throws UsageError. */
export function parseCommand(argv: string[], env: NodeJS.ProcessEnv = process.env): CliCommand {
  const program = buildProgram();
  let printed = '';
  let result: CliCommand | undefined;
  let failed = program;
  // Commander prints help and exits by itself; here it only reports, for main to decide.
  for (const c of commandsOf(program)) {
    c.exitOverride((err) => {
      failed = c;
      throw err;
    }).configureOutput({ writeErr: () => {}, writeOut: (s) => (printed += s) });
  }
  program.action(() => {
    const o = program.opts();
    if ((o.model as string[]).length === 0 && o.models === undefined) throw new UsageError('E_USAGE', NO_MODEL_USAGE);
    result = { command: 'run', options: nodeOptions(o, env) };
  });
  const sub = (parent: Command, name: string) => parent.commands.find((c) => c.name() === name)!;
  const statechart = sub(program, 'statechart');
  statechart.action(() => {
    const o = optionsOf(statechart) as { format: ChartFormat; machine: DrawnMachine };
    result = { command: 'statechart', format: o.format, machine: o.machine };
  });
  const fingerprint = sub(program, 'fingerprint');
  fingerprint.action(() => {
    const o = optionsOf(fingerprint) as Record<string, string | undefined>;
    result = { command: 'fingerprint', request: { model: o.model ?? '', tensorParallelSize: num(o.tensorParallelSize), planFile: o.planFile } };
  });
  const verify = sub(program, 'verify');
  verify.action(() => {
    const o = optionsOf(verify) as Record<string, string | undefined>;
    const globalRank = o.globalRank === undefined ? undefined : integer('--global-rank', o.globalRank, 0, Number.MAX_SAFE_INTEGER, 'pass a rank this node serves, as weightd ctl list shows them (default: the first)');
    if (o.name !== undefined || o.version !== undefined) {
      if (o.name === undefined || o.version === undefined || o.model !== undefined) throw new UsageError('E_USAGE', 'weightd verify takes --model DIR (a checkpoint version, against its files) or --name NAME --version N (a written version, against its recorded digests), not both nor half of either');
      result = { command: 'verifyWritten', request: { name: o.name, version: versionNumber('--version', o.version), socketDir: o.weightCacheSocketDir, globalRank } };
      return;
    }
    result = {
      command: 'verify',
      request: { model: o.model ?? '', tensorParallelSize: num(o.tensorParallelSize), planFile: o.planFile, socketDir: o.weightCacheSocketDir, globalRank },
    };
  });
  const ctl = sub(program, 'ctl');
  for (const [name, entry] of Object.entries(CTL_COMMANDS) as Array<[string, CtlCommand<ControlCommand>]>) {
    const leaf = sub(ctl, name);
    leaf.action((...args: unknown[]) => {
      const o = optionsOf(leaf);
      // Commander passes the declared operands first, then the options and the command.
      const operands = args.filter((a): a is string => typeof a === 'string');
      result = { command: 'ctl', request: entry.request(o, ...operands), control: o.control as string | undefined, socketDir: o.weightCacheSocketDir as string | undefined, json: o.json === true };
    });
  }
  ctl.action(() => {
    const names = Object.keys(CTL_COMMANDS);
    throw new UsageError('E_USAGE', `weightd ctl needs a command: ${names.slice(0, -1).join(', ')} or ${names.at(-1)}; run weightd ctl --help`);
  });
  const keeper = sub(program, 'keeper');
  const keeperSocket = (o: Record<string, unknown>) => (o.socket as string | undefined) ?? keeperSocketPath({ keeper: {} }, resolve((o.weightCacheSocketDir as string | undefined) ?? defaultSocketDir()));
  for (const action of ['status', 'stop'] as const) {
    const leaf = sub(keeper, action);
    leaf.action(() => {
      const o = optionsOf(leaf);
      result = { command: 'keeperAsk', action, socket: keeperSocket(o), json: o.json === true };
    });
  }
  keeper.action(() => {
    const o = optionsOf(keeper) as { adoptWithin: string; exitWhenEmpty?: boolean; requestTimeout?: string; idleTimeout?: string; logLevel: string };
    // The deadlines go as given, and only when given: the keeper checks them (exit 2 naming the
    // value) and its own defaults stand otherwise.
    const args = [
      '--socket', keeperSocket(o as Record<string, unknown>), '--adopt-within', o.adoptWithin, '--log-level', o.logLevel,
      ...(o.requestTimeout === undefined ? [] : ['--request-timeout', o.requestTimeout]),
      ...(o.idleTimeout === undefined ? [] : ['--idle-timeout', o.idleTimeout]),
    ];
    result = { command: 'keeper', args: o.exitWhenEmpty ? [...args, '--exit-when-empty'] : args };
  });
  try {
    program.parse(expandShortFlags(argv), { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version') return { command: 'print', text: printed };
      throw new UsageError('E_USAGE', usageMessage(err, program, failed));
    }
    throw err;
  }
  return result!;
}

/** The daemon's options from argv; --help and --version come back as `help`. Throws UsageError. */
export function parseArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): NodeOptions & { help?: string } {
  const c = parseCommand(argv, env);
  if (c.command === 'print') return { model: '', help: c.text };
  if (c.command !== 'run') throw new UsageError('E_USAGE', `${c.command}: not a daemon command here; run weightd --help`);
  return c.options;
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** --model and -tp, each maybe repeated: one tp for every model, or one per model in order. */
function modelOptions(models: string[], tps: string[]): Pick<NodeOptions, 'model' | 'tensorParallelSize' | 'models'> {
  if (tps.length > 1 && tps.length !== models.length) {
    throw new UsageError('E_USAGE', `--tensor-parallel-size is given ${tps.length} times for ${models.length} --model(s); give it once for all of them, or once per --model in the same order`);
  }
  const tpOf = (i: number) => num(tps.length > 1 ? tps[i] : (tps[0] ?? '1'));
  return {
    model: models[0] ?? '',
    tensorParallelSize: tpOf(0),
    models: models.length > 1 ? models.slice(1).map((model, i) => ({ model, tensorParallelSize: tpOf(i + 1) })) : undefined,
  };
}

function nodeOptions(o: Record<string, string | undefined>, env: NodeJS.ProcessEnv): NodeOptions {
  const fill: NodeOptions['fill'] = {};
  if (o.stagingMb !== undefined) fill.stagingBytes = num(o.stagingMb, 2 ** 20);
  if (o.loadThreads !== undefined) fill.threads = num(o.loadThreads);
  if (o.directIo === 'on' || o.directIo === 'off') fill.direct = o.directIo === 'on';
  const given = o as unknown as { model: string[]; tensorParallelSize: string[] };
  return {
    ...(o.models === undefined ? modelOptions(given.model, given.tensorParallelSize) : { model: '', modelsFile: o.models }),
    nnodes: num(o.nnodes),
    nodeRank: num(o.nodeRank),
    masterAddr: o.masterAddr,
    masterPort: num(o.masterPort),
    weightCacheMasterPort: num(o.weightCacheMasterPort),
    socketDir: o.weightCacheSocketDir,
    token: o.weightCacheToken ?? env.WEIGHTD_TOKEN,
    rendezvousTimeoutMs: num(o.rendezvousTimeout, 1000),
    device: o.device as NodeOptions['device'],
    cudaHandles: o.cudaHandles as NodeOptions['cudaHandles'],
    planFile: o.planFile,
    layouts: String(o.layouts).split(',').map((l) => l.trim()).filter((l) => l !== ''),
    fill,
    keeper: { mode: o.keeper as 'off' | 'spawn' | 'external', socket: o.keeperSocket, adoptWithinS: num(o.adoptWithin) },
    logLevel: o.logLevel as NodeOptions['logLevel'],
    evict: o.evict as EvictionPolicy,
    keepVersions: num(o.keepVersions),
    processedMaxPercent: num(o.processedMaxPercent),
    // The host alone is passed on too, so that a forgotten port is an error, not a silent no-op.
    inspect: o.inspectPort !== undefined || o.inspectHost !== undefined ? { port: num(o.inspectPort), host: o.inspectHost } : undefined,
  };
}
