// The control files of daemons that no longer run (killed with SIGKILL: nothing removed them),
// swept when a control socket starts. Each daemon's files have its pid in their names, so a live
// one's are never touched.
import { lstatSync, readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../log.js';
import { isProcessAlive, processIdentity } from '../wire/processLiveness.js';
import { CONTROL_FILE } from './controlSocket.js';

export function removeStaleControlFiles(dir: string, log: Logger): void {
  const uid = process.getuid!();
  for (const name of readdirSync(dir)) {
    const pid = Number(CONTROL_FILE.exec(name)?.[1] ?? 0);
    if (pid <= 0 || pid === process.pid || isProcessAlive(processIdentity(pid))) continue;
    const path = join(dir, name);
    try {
      if (lstatSync(path).uid !== uid) continue;
      unlinkSync(path);
      log.warn({ path, deadPid: pid }, 'removed the control file of a weightd that no longer runs');
    } catch {
      // Gone meanwhile: another daemon starting in this directory removed it first.
    }
  }
}
