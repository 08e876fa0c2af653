// The modules a rank's worker thread runs, by URL: the main thread starts threads of them, and a
// warm thread compares its rank's module with the real one (warmRankWorker.ts). No imports, so
// that a thread can know them without loading the supervisor's actors.

/** In dist/main.cjs, the rank thread's own bundle beside it (scripts/bundle-main.mjs); undeclared elsewhere. */
declare const __BUNDLED_RANK_THREAD__: string | undefined;

/** What each rank actor's worker thread runs unless startNode is given another module. */
export const rankWorkerModule = new URL('./rankWorker.js', import.meta.url);

/**
 * What a rank's thread started warm runs until it is handed its rank (src/models/workerRegistry.ts).
 * From the bundled daemon, the bundle of it: Node 20 loads a worker's ES modules one file at a
 * time with no compile cache, 3x the time of the same code as one CommonJS file (bench/RESULTS.md,
 * issue 33), and the rank's module then runs from that bundle too (warmRankWorker.ts).
 */
export const warmRankWorkerModule =
  typeof __BUNDLED_RANK_THREAD__ === 'string' ? new URL(`../../${__BUNDLED_RANK_THREAD__}`, import.meta.url) : new URL('./warmRankWorker.js', import.meta.url);
