// Command-line flags, named as the inference engines name them so one set of values can feed
// both. Parsing only: validation is resolveNodeOptions', shared with the programmatic API.
import { readFileSync } from 'node:fs';
import { Command, CommanderError, Option } from 'commander';
import { UsageError } from '../errors.js';
import type { NodeOptions } from '../nodeOptions.js';

const pkg = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string };

export const VERSION = pkg.version;

/** Engines spell the tensor-parallel short flag `-tp`, which commander would read as `-t -p`. */
function expandShortFlags(argv: string[]): string[] {
  return argv.flatMap((a) => (a === '-tp' ? ['--tensor-parallel-size'] : a.startsWith('-tp=') ? [`--tensor-parallel-size=${a.slice(4)}`] : [a]));
}

export function buildProgram(): Command {
  return new Command('weightd')
    .description('GPU weight cache daemon: loads a safetensors checkpoint once and serves each tensor-parallel shard over a Unix socket')
    .version(VERSION, '--version')
    .option('--model <dir>', 'checkpoint directory (safetensors + config.json)')
    .option('--tensor-parallel-size <n>', 'tensor-parallel size, all nodes together (also -tp <n>)', '1')
    .option('--nnodes <n>', 'number of nodes', '1')
    .option('--node-rank <r>', "this node's index, 0..nnodes-1", '0')
    .option('--master-addr <addr>', "node 0's address (the engine's value)", '127.0.0.1')
    .option('--master-port <port>', "the engine's rendezvous port (checked to differ from ours)")
    .option('--weight-cache-master-port <port>', "the daemon's own rendezvous port, same on every node (required with --nnodes > 1)")
    .option('--weight-cache-socket-dir <dir>', 'directory for the per-device sockets (default: a private per-user dir under the temp dir)')
    .option('--weight-cache-token <token>', 'shared secret for multi-node rendezvous (or env WEIGHTD_TOKEN)')
    .option('--rendezvous-timeout <seconds>', 'how long to wait for every node', '300')
    .addOption(new Option('--device <backend>', 'device backend').choices(['auto', 'cuda', 'host']).default('auto'))
    .option('--plan-file <file>', 'JSON sharding plan overriding the built-in rules')
    .option('--staging-mb <mib>', 'pinned staging memory for the copy engine, per rank (cuda)')
    .option('--load-threads <n>', 'reader threads per rank')
    .addOption(new Option('--log-level <level>', 'log level').choices(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info'))
    .helpOption('-h, --help', 'show this help')
    .showHelpAfterError('(run weightd --help for every flag)');
}

function num(value: string | undefined, scale = 1): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  return value.trim() !== '' && Number.isFinite(n) ? n * scale : (value as unknown as number);
}

/** Parses argv (without node and script) into start options. Throws UsageError. */
export function parseArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): NodeOptions & { help?: string } {
  const program = buildProgram().exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  try {
    program.parse(expandShortFlags(argv), { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed') return { model: '', help: program.helpInformation() };
      if (err.code === 'commander.version') return { model: '', help: `${VERSION}\n` };
      throw new UsageError('E_USAGE', `${err.message.replace(/^error: /, '')}; run weightd --help for every flag`);
    }
    throw err;
  }
  const o = program.opts<Record<string, string | undefined>>();
  const fill: NodeOptions['fill'] = {};
  if (o.stagingMb !== undefined) fill.stagingBytes = num(o.stagingMb, 2 ** 20);
  if (o.loadThreads !== undefined) fill.threads = num(o.loadThreads);
  return {
    model: o.model ?? '',
    tensorParallelSize: num(o.tensorParallelSize),
    nnodes: num(o.nnodes),
    nodeRank: num(o.nodeRank),
    masterAddr: o.masterAddr,
    masterPort: num(o.masterPort),
    weightCacheMasterPort: num(o.weightCacheMasterPort),
    socketDir: o.weightCacheSocketDir,
    token: o.weightCacheToken ?? env.WEIGHTD_TOKEN,
    rendezvousTimeoutMs: num(o.rendezvousTimeout, 1000),
    device: o.device as NodeOptions['device'],
    planFile: o.planFile,
    fill,
    logLevel: o.logLevel as NodeOptions['logLevel'],
  };
}
