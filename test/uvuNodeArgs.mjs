// How test/run.mjs starts node on each compiled test file, shared with the runner's own test
// (test/runner/failureReport.test.ts): --expose-gc lets tests of finalizers (native mappings)
// force a collection. The failure report (test/uvuFailureReport.mjs) needs no flag: the compiled
// tests' 'uvu' loads it (scripts/link-test-uvu.mjs), so a file run by hand gets it too.
export const uvuNodeArgs = ['--expose-gc'];
