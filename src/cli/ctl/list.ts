// weightd ctl list: its flags, its request and what it prints.
import type { ModelStatus } from '../../nodeStatus.js';
import type { CtlCommand } from './ctlCommand.js';

export const list: CtlCommand<'list'> = {
  description: 'list the models the daemon serves, with their ranks, bytes and leases',
  examples: ['weightd ctl list --json --weight-cache-socket-dir /run/weightd'],
  flags: (c) => c,
  request: () => ({ cmd: 'list' }),
  /** One line per model version. */
  print: (reply) => {
    const lines = (reply.models as ModelStatus[]).map((m) => {
      const ranks = m.ranks.map((r) => `${r.globalRank}:${r.device?.uuid ?? '?'}`).join(' ');
      const version = `v${m.version ?? 0}${m.state === 'serving' && m.current === false ? ' (retained)' : ''}`;
      return `${m.name}${m.own ? ' (own)' : ''}  ${version}  ${m.state}  tp=${m.tpSize}  ${(m.bytes / 2 ** 20).toFixed(1)} MiB  leases=${m.leases}  ${m.fingerprint?.slice(0, 16) ?? '?'}  ${m.model}  ranks ${ranks}`;
    });
    return `${lines.join('\n')}\n`;
  },
};
