// How test/run.mjs starts node on each compiled test file, shared with the runner's own test
// (test/runner/failureReport.test.ts): --expose-gc lets tests of finalizers (native mappings)
// force a collection; --import makes uvu print every failure (test/uvuFailureReport.mjs).
export const uvuNodeArgs = ['--expose-gc', '--import', new URL('./uvuFailureReport.mjs', import.meta.url).href];
