// A rank's worker thread started warm: while the node still plans, it loads what every rank's
// thread loads (its ES modules, xstate, the addon; the keeper's side when the node has a keeper),
// which took 100-140 ms of a start on the development VM between the rank table and the rank's
// first phase. Then it waits for the rank it is to be (WarmRankStart, from
// src/models/workerRegistry.ts) and runs that rank's module, which finds its data and messages
// through rankThread.ts.
import { workerData } from 'node:worker_threads';
import { addon } from '../native/addon.js';
import { awaitWarmStart } from './rankThread.js';
import { rankKeeping } from './rankPhases.js';
import './runRankPhases.js';

/** workerData of a thread started warm. */
export interface WarmRankWorkerData {
  warm: true;
  /** The node keeps its ranks' shards in a keeper: load the keeper's side too. */
  keeper: boolean;
}

addon();
if ((workerData as WarmRankWorkerData).keeper) void rankKeeping();
// A module that fails to load fails the thread as a rank's failure would (its 'error' event): the
// rejection is left unhandled on purpose.
awaitWarmStart((start) => void import(start.module));
