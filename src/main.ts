#!/usr/bin/env node
// weightd's command line: one process per node. Exit codes: 0 stopped on a signal, 1 failed at
// run time, 2 bad flags.
import { writeSync } from 'node:fs';
import { parseCommand } from './cli/parseArgs.js';
import { printFingerprints } from './cli/printFingerprints.js';
import { UsageError, WeightdError } from './errors.js';
import { chartToMermaid, machineToChart } from './inspect/machineToMermaid.js';
import { flushLogger } from './log.js';
import { supervisorMachine } from './machines/supervisor.js';
import { startNode } from './startNode.js';

async function main(argv: string[]): Promise<number> {
  let node;
  try {
    const cli = parseCommand(argv);
    if (cli.command === 'print') {
      process.stdout.write(cli.text);
      return 0;
    }
    if (cli.command === 'statechart') {
      const chart = machineToChart(supervisorMachine);
      process.stdout.write(cli.format === 'json' ? `${JSON.stringify(chart, null, 2)}\n` : chartToMermaid(chart));
      return 0;
    }
    if (cli.command === 'fingerprint') {
      process.stdout.write(await printFingerprints(cli.request));
      return 0;
    }
    node = await startNode(cli.options);
  } catch (err) {
    if (err instanceof UsageError) {
      writeSync(2, `weightd: ${err.message}\n`);
      return 2;
    }
    // A checkpoint that cannot be planned (weightd fingerprint): a run-time failure, not a bug.
    if (err instanceof WeightdError) {
      writeSync(2, `weightd: ${err.code}: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  const started = node;
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => void started.stop(signal));
  }
  started.ready.then(
    async (status) => {
      await flushLogger(started.log);
      // One line, once, after every earlier log line: what launchers and tests wait for.
      writeSync(2, `READY node ${status.nodeRank}/${status.nnodes} local_ranks=${status.ranks.length} tp=${status.tpSize} model=${status.model}\n`);
    },
    () => {},
  );
  const result = await started.done;
  return result.state === 'stopped' ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    writeSync(2, `weightd: internal error: ${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
