// weightd ctl load: its flags, its request and what it prints.
import { Option, type Command } from 'commander';
import { resolve } from 'node:path';
import type { ControlRequestOf } from '../../control/controlProtocol.js';
import { EVICTION_POLICIES, type EvictionPolicy } from '../../models/evictionPolicy.js';
import type { LoadResult } from '../../nodeStatus.js';
import { num } from '../../flagValues.js';
import type { CtlCommand } from './ctlCommand.js';

export const load: CtlCommand<'load'> = {
  description: 'load a model beside those resident; a new version of a loaded name replaces it once resident (the old one drains)',
  examples: ['weightd ctl load --model /models/llama-1b-draft -tp 1 --weight-cache-socket-dir /run/weightd'],
  flags: (c: Command) =>
    c
      .requiredOption('--model <dir>', 'checkpoint directory')
      .option('--tensor-parallel-size <n>', 'tensor-parallel size (also -tp <n>)', '1')
      .option('--name <name>', "the model's name (default: the directory's name); a loaded name makes this a new version of it")
      .option('--plan-file <file>', 'JSON sharding plan')
      .option('--layouts <names>', 'layouts to serve, comma-separated', 'checkpoint')
      .addOption(new Option('--evict <policy>', "what this load may evict when it does not fit (default: the daemon's --evict)").choices(EVICTION_POLICIES)),
  request: (o): ControlRequestOf<'load'> => ({
    cmd: 'load',
    model: resolve(o.model as string),
    name: o.name as string | undefined,
    tensorParallelSize: num(o.tensorParallelSize as string) as number,
    planFile: o.planFile === undefined ? undefined : resolve(o.planFile as string),
    layouts: String(o.layouts).split(',').map((l) => l.trim()).filter((l) => l !== '' && l !== 'checkpoint'),
    evict: o.evict as EvictionPolicy | undefined,
  }),
  /** What it evicted, then what it did. */
  print: (reply) => {
    const r = reply as unknown as LoadResult;
    const evicted = (r.evicted ?? []).map((e) => `evicted ${e.name}${e.own ? ' (own)' : ''} (fingerprint ${e.fingerprint.slice(0, 16)}, ${(e.bytes / 2 ** 20).toFixed(1)} MiB, last used ${e.lastUsedAt === undefined ? '?' : new Date(e.lastUsedAt).toISOString()})\n`);
    return evicted.join('') + (r.alreadyLoaded ? `${r.name} is already loaded (fingerprint ${r.fingerprint}): nothing to do\n` : `${r.name} loaded and serving (fingerprint ${r.fingerprint})\n`);
  },
};
