// `weightd keeper ...`: runs weightd-keeper in the foreground, as a unit or a container runs it.
// Node cannot exec(), so the keeper is a child that gets this process's stdio and the stop
// signals, and its exit code becomes weightd's (its own: 2 bad flags, 3 a keeper already serves).
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import { KeeperError } from '../errors.js';
import { keeperBinaryPath } from '../keeper/keeperClient.js';

const FORWARDED = ['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGQUIT'] as const;

export function runKeeper(args: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    // --stop-with-parent: the keeper stops when this process ends, also by SIGKILL, which it
    // could not forward; an orphaned keeper would hold memory and the socket with no one to stop it.
    // The handlers go in before the keeper starts: installed after, a signal sent as soon as the
    // keeper says it serves could find this process, descheduled on a busy machine, still
    // without them, and end it by the default action. A signal is handled on the event loop,
    // so the child exists by the time `forward` runs.
    const forward = (signal: NodeJS.Signals) => child.kill(signal);
    for (const s of FORWARDED) process.on(s, forward);
    let child: ChildProcess;
    try {
      child = spawn(keeperBinaryPath, [...args, '--stop-with-parent', String(process.pid)], { stdio: 'inherit' });
    } catch (err) {
      for (const s of FORWARDED) process.off(s, forward);
      throw err;
    }
    child.once('error', (err) =>
      reject(new KeeperError('E_KEEPER_NOT_FOUND', `cannot run ${keeperBinaryPath}: ${err.message}; build it with "npm run build:native"`, { binary: keeperBinaryPath }, { cause: err })),
    );
    child.once('exit', (code, signal) => {
      for (const s of FORWARDED) process.off(s, forward);
      resolve(code ?? 128 + (signal ? constants.signals[signal] : 0));
    });
  });
}
