// A rank's worker thread started warm: while the node still plans, it loads what every rank's
// thread loads (its ES modules, xstate, the addon), which took 100-140 ms of a start on the
// development VM between the rank table and the rank's first phase. Not the keeper's side: a
// rank that loads needs it only to keep its shard, once filled, and loads it during its fill
// (runRankPhases.ts); loaded here, it was still loading when the rank started, and its first
// phases waited for it (50-90 ms on the VM). Then it waits for the rank it is to be
// (WarmRankStart, from src/models/workerRegistry.ts) and runs that rank's module, which finds its
// data and messages through rankThread.ts.
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { addon } from '../native/addon.js';
import { awaitWarmStart } from './rankThread.js';
import { rankWorkerModule } from './rankWorkerModules.js';
import './runRankPhases.js';

/** workerData of a thread started warm. */
export interface WarmRankWorkerData {
  warm: true;
}

addon();
// A module that fails to load fails the thread as a rank's failure would (its 'error' event): the
// rejection is left unhandled on purpose. The real rank's module by a static specifier, which is
// the same module unbundled, and in the rank thread's bundle (dist/rank-thread.cjs) the copy
// bundled with this one: the thread then loads no ES module at all. Another module (a test's) by
// its URL.
awaitWarmStart((start) => void (sameFile(start.module, rankWorkerModule) ? import('./rankWorker.js') : import(start.module)));

/**
 * Whether `url` names the file of `module`, through symbolic links: the main thread's bundle and
 * this thread's may each sit in a directory linked to the other's (an install's dist/ linking to
 * a checkout's), and their URLs then differ for one file.
 */
function sameFile(url: string, module: URL): boolean {
  try {
    return realpathSync(fileURLToPath(url)) === realpathSync(fileURLToPath(module));
  } catch {
    return false;
  }
}
