// A daemon restart as an operator sees it, with and without the keeper, timed the same way in
// the same run (docs/operations.md, "Restarts and upgrades"):
// The daemon is WEIGHTD_BIN when set (a launcher: ./weightd, a bundle's bin/weightd), else dist/main.js.
//   loaded:  spawn a daemon with --keeper spawn on a checkpoint nobody keeps yet; wall clock from
//            spawn to its READY line (the page cache is hot: this is a plain daemon start);
//   adopted: stop it (SIGTERM, as `systemctl restart` does) and spawn the next one with the same
//            flags; wall clock to READY, and the bytes it read (/proc/<pid>/io rchar), against the
//            first's: adoption reads headers and content samples, never the tensors;
//   attach:  a fresh Python process attaching to the adopting daemon (first attach, and a second);
//   RSS:     each daemon's peak (VmHWM, the arena it maps included; and the peak of its own heap,
//            RssAnon, sampled) and the keeper's, from their own /proc.
// Usage: node dist/bench/restart.js --model DIR --out DIR [--device host|cuda] [--runs 3] [--tp 1]
//        [--cuda-handles fd] (cuda: only VMM descriptors can be kept; legacy IPC handles cannot)
//        [--restart-may-load] (a build whose keeper cannot hold the shard: its restart loads from
//        the checkpoint, and is timed as such; raw.jsonl's adoptedRanks says which it was)
// Writes raw.jsonl, daemon.jsonl and summary.json into --out, a new folder.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { KeeperClient } from '../src/keeper/keeperClient.js';
import { exampleModel } from '../test/helpers/paths.js';
import { attachInFreshProcess, benchRun, median, processCpuMs, processMemory, spawnUntilReady } from './measure.js';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: exampleModel },
    out: { type: 'string' },
    device: { type: 'string', default: 'host' },
    runs: { type: 'string', default: '3' },
    tp: { type: 'string', default: '1' },
    'cuda-handles': { type: 'string', default: 'fd' },
    'restart-may-load': { type: 'boolean', default: false },
  },
});
const { out, model, device, runs, files, bytes, daemon } = benchRun(values, 'restart');
const tp = Number(values.tp);

function readChars(pid: number): number {
  return Number(/rchar: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))![1]);
}

interface Ready {
  wallMs: number;
  peakRssBytes: number;
  /** The daemon's own heap at its peak (RssAnon, sampled): on the host backend VmHWM counts the arena. */
  peakRssAnonBytes: number;
  readChars: number;
  /** Its CPU time at READY, every thread: on a loaded machine steadier than the wall clock. */
  cpuAtReadyMs: number;
  adoptedRanks: number;
  stop: () => Promise<void>;
}

async function startDaemon(run: number, which: string, socketDir: string, devices: string): Promise<Ready> {
  const args = [...daemon, '--model', model, '-tp', String(tp), '--device', device, '--weight-cache-socket-dir', socketDir, '--keeper', 'spawn'];
  if (device === 'cuda') args.push('--cuda-handles', values['cuda-handles']!);
  const d = await spawnUntilReady(args, { ...process.env, WEIGHTD_HOST_DEVICES: devices });
  const ready = d.lines().find((l) => l.ready === true) as unknown as { adoptedRanks: number };
  return {
    wallMs: d.wallMs,
    peakRssBytes: d.memory().vmHwm,
    peakRssAnonBytes: d.memory().peakRssAnon,
    readChars: readChars(d.pid),
    cpuAtReadyMs: processCpuMs(d.pid),
    adoptedRanks: ready.adoptedRanks,
    stop: () => d.stop(join(out, 'daemon.jsonl'), { run, which }),
  };
}

spawnSync('cat', files, { stdio: ['ignore', 'ignore', 'inherit'] }); // hot page cache for both
const rows: Array<{ loaded: Ready; adopted: Ready; attach: ReturnType<typeof attachInFreshProcess>; keeperRssBytes: number }> = [];
for (let run = 1; run <= runs; run++) {
  const socketDir = mkdtempSync(join(tmpdir(), 'wd-bench-restart-'));
  const devices = Array.from({ length: tp }, (_, i) => `bench-restart-${process.pid}-${run}-${i}`).join(',');
  const keeper = new KeeperClient(join(socketDir, 'keeper.sock'));
  let keeperPid: number | undefined;
  try {
    const loaded = await startDaemon(run, 'loaded', socketDir, devices);
    keeperPid = (await keeper.ping()).pid;
    await loaded.stop();
    const adopted = await startDaemon(run, 'adopted', socketDir, devices);
    let attach: ReturnType<typeof attachInFreshProcess>;
    let keeperRssBytes: number;
    try {
      if (adopted.adoptedRanks !== tp && !values['restart-may-load']) throw new Error(`run ${run}: the restart adopted ${adopted.adoptedRanks} of ${tp} ranks (daemon.jsonl says why)`);
      attach = attachInFreshProcess(socketDir, device);
      // 0: the keeper had exited (one spawned ends once it holds nothing: a keep it refused).
      keeperRssBytes = existsSync(`/proc/${keeperPid}`) ? processMemory(keeperPid!).vmHwm : 0;
    } finally {
      // A failed run must not leave the daemon (and its arena) running after the benchmark.
      await adopted.stop();
    }
    const row = { loaded, adopted, attach, keeperRssBytes };
    rows.push(row);
    const strip = ({ stop: _, ...r }: Ready) => r;
    appendFileSync(join(out, 'raw.jsonl'), `${JSON.stringify({ run, device, tp, model, bytes, loaded: strip(loaded), adopted: strip(adopted), attach, keeperRssBytes })}\n`);
  } finally {
    if (keeperPid !== undefined) spawnSync('kill', ['-TERM', String(keeperPid)]);
    rmSync(socketDir, { recursive: true, force: true });
  }
}
const summary = {
  date: new Date().toISOString(),
  device,
  tp,
  model,
  bytes,
  runs,
  loadedReadyWallMsMedian: median(rows.map((r) => r.loaded.wallMs)),
  adoptedReadyWallMsMedian: median(rows.map((r) => r.adopted.wallMs)),
  loadedCpuAtReadyMsMedian: median(rows.map((r) => r.loaded.cpuAtReadyMs)),
  adoptedCpuAtReadyMsMedian: median(rows.map((r) => r.adopted.cpuAtReadyMs)),
  loadedReadCharsMedian: median(rows.map((r) => r.loaded.readChars)),
  adoptedReadCharsMedian: median(rows.map((r) => r.adopted.readChars)),
  firstAttachMsMedian: median(rows.map((r) => r.attach.firstMs)),
  secondAttachMsMedian: median(rows.map((r) => r.attach.secondMs)),
  tensors: rows[0]?.attach.tensors,
  daemonPeakRssBytesMax: Math.max(...rows.flatMap((r) => [r.loaded.peakRssBytes, r.adopted.peakRssBytes])),
  daemonPeakRssAnonBytesMax: Math.max(...rows.flatMap((r) => [r.loaded.peakRssAnonBytes, r.adopted.peakRssAnonBytes])),
  keeperPeakRssBytesMax: Math.max(...rows.map((r) => r.keeperRssBytes)),
};
writeFileSync(join(out, 'summary.json'), `${JSON.stringify(summary, null, 1)}\n`);
console.log(JSON.stringify(summary));
