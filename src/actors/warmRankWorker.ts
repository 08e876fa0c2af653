// A rank's worker thread started warm: while the node still plans, it loads what every rank's
// thread loads (its ES modules, xstate, the addon), which took 100-140 ms of a start on the
// development VM between the rank table and the rank's first phase. Not the keeper's side: a
// rank that loads needs it only to keep its shard, once filled, and loads it during its fill
// (runRankPhases.ts); loaded here, it was still loading when the rank started, and its first
// phases waited for it (50-90 ms on the VM). Then it waits for the rank it is to be
// (WarmRankStart, from src/models/workerRegistry.ts) and runs that rank's module, which finds its
// data and messages through rankThread.ts.
import { addon } from '../native/addon.js';
import { awaitWarmStart } from './rankThread.js';
import './runRankPhases.js';

/** workerData of a thread started warm. */
export interface WarmRankWorkerData {
  warm: true;
}

addon();
// A module that fails to load fails the thread as a rank's failure would (its 'error' event): the
// rejection is left unhandled on purpose.
awaitWarmStart((start) => void import(start.module));
