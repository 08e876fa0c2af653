// Issue 6's multi-node scenarios with real daemons, every node on this machine's loopback: the
// same scenarios as e2e.netns.test, for machines without network namespaces.
import { test } from 'uvu';
import { loopbackFabric } from '../helpers/netns.js';
import { defineScenarios } from './e2eScenarios.js';

defineScenarios(test, loopbackFabric);
test.run();
