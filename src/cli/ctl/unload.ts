// weightd ctl unload: its flags, its request and what it prints.
import type { Command } from 'commander';
import type { UnloadResult } from '../../nodeStatus.js';
import type { CtlCommand } from './ctlCommand.js';

export const unload: CtlCommand<'unload'> = {
  description: 'unload a model by name or fingerprint: no new lease; freed when its last lease ends, or at once with --force',
  examples: ['weightd ctl unload llama-1b-draft --weight-cache-socket-dir /run/weightd'],
  flags: (c: Command) => c.argument('<name-or-fingerprint>').option('--force', 'free it now: revoke the leases (their holders are told)'),
  request: (o, target) => ({ cmd: 'unload', target: target!, force: o.force === true }),
  /** One line per version it unloaded. */
  print: (reply) => {
    const r = reply as unknown as UnloadResult;
    return r.unloaded
      .map((u) => {
        const leases = `${u.leases} lease${u.leases === 1 ? '' : 's'}`;
        const when = r.force ? `freed now${u.leases > 0 ? `, ${leases} revoked` : ''}` : u.leases > 0 ? `draining: freed when its ${leases} end` : 'freed (no lease)';
        return `${u.name} (fingerprint ${u.fingerprint.slice(0, 16)}) unloaded: ${when}\n`;
      })
      .join('');
  },
};
