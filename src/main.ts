#!/usr/bin/env node
// weightd's command line: one process per node. Exit codes: 0 stopped on a signal, 1 failed at
// run time, 2 bad flags (README.md, "Exit codes").
// Each command's modules load only when that command runs: serving needs no chart drawing and
// no fingerprint printing, and --help or ctl needs none of the node.
import { ShardingError, UsageError, WeightdError, type SerializedError } from './errors.js';
import { flushLogger, writeCliError } from './log.js';
import { endProcess, settledThreadWork, STOP_SIGNALS, THREAD_WORK_GRACE_MS, type StopSignal } from './endProcess.js';

export { STOP_SIGNALS } from './endProcess.js';

/**
 * How long a stop may take in all before the process ends without finishing it, beyond the
 * ranks' own bound (supervisor.ts's STOP_TIMEOUT_MS): time to remove the sockets, locks,
 * node.json and segments.
 */
const STOP_CLEANUP_MS = 15_000;

/** The first stop signal, which is also how the process ends when it cannot exit cleanly. */
let stopSignal: StopSignal | undefined;

/**
 * Failures found after parsing that only other flags can fix (a tp size the model's shapes do
 * not divide, --device cuda without a driver, --cuda-handles fd on GPUs without descriptor
 * export, the same checkpoint listed twice) exit 2 like bad flags: restarting cannot help.
 */
function isUsageFailure(f: Pick<SerializedError, 'name' | 'code'> | undefined): boolean {
  return f?.name === ShardingError.name || f?.name === UsageError.name || f?.code === 'E_NO_CUDA' || f?.code === 'E_CUDA_HANDLES_UNSUPPORTED';
}

async function main(argv: string[]): Promise<number> {
  let node;
  let endWarmup = (): Promise<void> => Promise.resolve();
  try {
    // Answered before the command line's parser loads (commander and the flags' modules: ~15 ms
    // of a command whose whole work is one line). Only the bare flag: anywhere else commander
    // reads it with the rest of the command line.
    if (argv.length === 1 && argv[0] === '--version') {
      const { VERSION } = await import('./version.js');
      process.stdout.write(`${VERSION}\n`);
      return 0;
    }
    const { parseCommand } = await import('./cli/parseArgs.js');
    const cli = parseCommand(argv);
    if (cli.command === 'print') {
      process.stdout.write(cli.text);
      return 0;
    }
    if (cli.command === 'statechart') {
      const [{ drawnChart }, { chartToMermaid }] = await Promise.all([import('./machines/drawnMachines.js'), import('./inspect/machineToMermaid.js')]);
      const chart = drawnChart(cli.machine);
      process.stdout.write(cli.format === 'json' ? `${JSON.stringify(chart, null, 2)}\n` : chartToMermaid(chart));
      return 0;
    }
    if (cli.command === 'fingerprint') {
      const { printFingerprints } = await import('./cli/printFingerprints.js');
      process.stdout.write(await printFingerprints(cli.request));
      return 0;
    }
    if (cli.command === 'verify') {
      const { runVerify } = await import('./cli/runVerify.js');
      return await runVerify(cli.request);
    }
    if (cli.command === 'verifyWritten') {
      const { verifyWritten } = await import('./cli/verifyWritten.js');
      return await verifyWritten(cli.request);
    }
    if (cli.command === 'ctl') {
      const { runCtl } = await import('./cli/runCtl.js');
      return await runCtl(cli);
    }
    if (cli.command === 'keeper') {
      const { runKeeper } = await import('./cli/runKeeper.js');
      return await runKeeper(cli.args);
    }
    if (cli.command === 'keeperAsk') {
      const { askKeeper } = await import('./cli/askKeeper.js');
      return await askKeeper(cli);
    }
    // CUDA's start-up (the driver, each local GPU's context) runs while the daemon's modules
    // load and it plans; the ranks find it done. Bad flags are for startNode to report.
    if (cli.options.device !== 'host') {
      const cuda = await import('./native/cuda.js');
      const localGpus = (cli.options.tensorParallelSize ?? 1) / (cli.options.nnodes ?? 1);
      const warming = cuda.warmCuda(Number.isInteger(localGpus) && localGpus > 0 && localGpus <= 64 ? localGpus : 1);
      // Waits for the warm-up, so that no reference is taken after the process has moved on.
      endWarmup = () => warming.then(cuda.endCudaWarmup);
    }
    // Loaded only to run a node: it brings in the addon, which --help and statechart never need.
    const { startNode } = await import('./startNode.js');
    node = await startNode(cli.options);
  } catch (err) {
    await endWarmup();
    // A refusal found while reading the checkpoint can leave its sibling reads in flight.
    await settledThreadWork();
    if (err instanceof UsageError) {
      writeCliError(err.message, { code: err.code });
      return 2;
    }
    // A checkpoint that cannot be planned (weightd fingerprint): a run-time failure, not a bug;
    // one that cannot be sharded by the tp size asked for is the flag's fault.
    if (err instanceof WeightdError) {
      writeCliError(`${err.code}: ${err.message}`, { code: err.code });
      return isUsageFailure(err) ? 2 : 1;
    }
    throw err;
  }
  const started = node;
  // Loaded with the node already; imported here so that the other commands load no machine.
  const { STOP_TIMEOUT_MS } = await import('./machines/supervisor.js');
  const stopGraceMs = STOP_TIMEOUT_MS + STOP_CLEANUP_MS;
  // Once every rank holds its own GPU context (ready), or the start has failed.
  started.ready.then(endWarmup, endWarmup);
  // Handlers stay installed until the process ends: a second signal while stopping (an impatient
  // Ctrl-C) must not fall back to the default action, which kills at once and leaves the locks.
  for (const signal of STOP_SIGNALS) {
    process.on(signal, () => {
      if (stopSignal === undefined) {
        stopSignal = signal;
        // A stop stuck on a thread that never returns must still end the process.
        setTimeout(() => {
          started.log.error({ code: 'E_STOP_GRACE', signal }, `the stop did not finish within ${stopGraceMs / 1000} s; ending the process by ${signal} without it`);
          void flushLogger(started.log).finally(() => endProcess(1, signal, false));
        }, stopGraceMs).unref();
      }
      if (started.status().state === 'stopping') started.log.warn({ signal }, `${signal} while stopping: the stop goes on (SIGKILL ends the process without cleanup)`);
      void started.stop(signal);
    });
  }
  started.ready.then(
    async (status) => {
      await flushLogger(started.log);
      // One line, once, after every earlier log line: what launchers and tests wait for. It is
      // the readiness signal, not chatter, so it is written at any --log-level (a child logger
      // may be more verbose than its parent).
      // How many ranks were adopted from a keeper rather than read from the checkpoint.
      const adopted = status.ranks.filter((r) => r.source?.from === 'keeper').length;
      started.log.child({}, { level: 'info' }).info(
        { ready: true, nnodes: status.nnodes, localRanks: status.ranks.length, tp: status.tpSize, model: status.model, adoptedRanks: adopted },
        `READY node ${status.nodeRank}/${status.nnodes} local_ranks=${status.ranks.length} tp=${status.tpSize} model=${status.model} adopted=${adopted}`,
      );
    },
    () => {},
  );
  const result = await started.done;
  await endWarmup();
  // Flushed first, so that a log write still in flight is not taken for a blocked thread.
  await flushLogger(started.log);
  const pending = await settledThreadWork();
  if (pending.length > 0) {
    started.log.warn({ pending, signal: stopSignal }, `stopped, but threads are still blocked ${THREAD_WORK_GRACE_MS / 1000} s later (${pending.join(', ')}); ending the process by a signal, since exiting would wait for them`);
    await flushLogger(started.log);
  }
  return result.state === 'stopped' ? 0 : isUsageFailure(result.failure) ? 2 : 1;
}

main(process.argv.slice(2)).then(
  (code) => endProcess(code, stopSignal, true),
  (err: unknown) => {
    writeCliError(`internal error: ${(err as Error)?.stack ?? String(err)}`, { code: 'E_INTERNAL' });
    endProcess(1, stopSignal, true);
  },
);
