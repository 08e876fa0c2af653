// The rank actor's worker module (the default the composition root gives it): a rank that runs
// the real phases of src/actors/rankPhases.ts (runRankPhases.ts).
import { rankPhases } from './rankPhases.js';
import { runRankPhases } from './runRankPhases.js';

runRankPhases(rankPhases);
