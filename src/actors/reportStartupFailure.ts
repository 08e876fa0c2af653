// A node of a multi-node group that fails before it can join (its checkpoint cannot be
// planned, its devices are short) tells node 0, so every node fails now, naming it, instead of
// waiting out the rendezvous timeout. Best effort, and bounded: the node is ending anyway.
import { hostname } from 'node:os';
import { fromPromise } from 'xstate';
import type { ReportStartupFailureInput } from '../machines/supervisorActors.js';
import { reportStartupFailure } from '../rendezvous/startupFailureReport.js';
import { groupTiming } from '../rendezvous/timing.js';

/** How long node 0 gets to answer; it may not be up yet, and then it names this node missing. */
export const REPORT_TIMEOUT_MS = 10_000;

export const reportStartupFailureActor = fromPromise<boolean, ReportStartupFailureInput>(async ({ input }) => {
  const { config, failure, log } = input;
  const delivered = await reportStartupFailure({
    host: config.masterAddr,
    port: config.weightCachePort,
    token: config.token,
    nodeRank: config.nodeRank,
    hostName: hostname(),
    error: failure,
    timing: groupTiming(),
    timeoutMs: REPORT_TIMEOUT_MS,
  });
  if (delivered) log.info({ node0: `${config.masterAddr}:${config.weightCachePort}` }, 'told node 0 that this node failed before joining');
  else log.warn({ node0: `${config.masterAddr}:${config.weightCachePort}` }, 'could not tell node 0 of this failure; the other nodes will name this node at their timeout');
  return delivered;
});
