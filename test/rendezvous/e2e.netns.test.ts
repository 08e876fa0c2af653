// Issue 6's multi-node scenarios with real daemons, each node in its own network namespace.
// Needs root and `ip netns`; elsewhere the file reports one skipped test saying why.
import { test } from 'uvu';
import { netnsFabric, netnsUnavailable } from '../helpers/netns.js';
import { defineScenarios } from './e2eScenarios.js';

const why = netnsUnavailable();
if (why) {
  // SKIPPED: the line test/run.mjs collects into its summary of skips.
  console.log(`SKIPPED: the network-namespace scenarios: ${why} (e2e.loopback.test runs the same scenarios)`);
  test.skip(`multi-node scenarios in network namespaces (${why})`, () => {});
} else {
  defineScenarios(test, netnsFabric);
}
test.run();
