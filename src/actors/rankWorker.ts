// The rank actor's worker module (the default the composition root gives it): a rank that runs
// the real phases of src/actors/rankPhases.ts.
import { rankPhases, runRankPhases } from './rankPhases.js';

runRankPhases(rankPhases);
