// weightd ctl rollback: its operands, its request and what it prints.
import type { Command } from 'commander';
import type { RollbackResult } from '../../nodeStatus.js';
import { versionNumber } from '../../flagValues.js';
import type { CtlCommand } from './ctlCommand.js';

export const rollback: CtlCommand<'rollback'> = {
  description: "make a version of a model that a writer's commits left resident (--keep-versions) current again, with no copy",
  examples: ['weightd ctl rollback llama-8b 0 --weight-cache-socket-dir /run/weightd'],
  flags: (c: Command) => c.argument('<name>').argument('<version>', 'the version number, as weightd ctl list shows it (v0, v1, ...: the number)'),
  request: (_o, name, version) => ({
    cmd: 'rollback',
    name: name!,
    version: versionNumber('<version>', version),
  }),
  print: (reply) => {
    const r = reply as unknown as RollbackResult;
    return `${r.name} version ${r.version} (fingerprint ${r.fingerprint.slice(0, 16)}) ${r.alreadyCurrent ? 'was current already' : 'is current now'}\n`;
  },
};
