// A cold start as an operator sees it after a reboot: the page cache dropped, wall clock from
// spawning the daemon to its READY line, against two baselines timed the same way in the same run,
// each from a dropped cache: `cat` of the same files (one sequential stream) and
// bench/odirect-probe.py (the files read with O_DIRECT by several threads: the disk's ceiling).
// Dropping the page cache needs root (/proc/sys/vm/drop_caches).
// Usage: node dist/bench/cold.js --model DIR --out DIR [--device cuda|host] [--runs 3] [--probe-threads 8,32]
// Writes raw.jsonl (one line per measurement), daemon.jsonl (the daemons' logs) and summary.json
// (medians; ratios are baseline / READY, so 1.0 means as fast as the baseline) into --out, which
// must not exist yet.
import { spawnSync } from 'node:child_process';
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { exampleModel, repoRoot } from '../test/helpers/paths.js';
import { benchRun, median, spawnUntilReady } from './measure.js';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: exampleModel }, out: { type: 'string' }, device: { type: 'string', default: 'host' }, runs: { type: 'string', default: '3' },
    'probe-threads': { type: 'string', default: '8,32' },
  },
});
const { out, model, device, runs, files, bytes, daemon, python } = benchRun(values, 'cold');
const probeThreads = values['probe-threads']!.split(',').map(Number);

function record(row: Record<string, unknown>): void {
  appendFileSync(join(out, 'raw.jsonl'), `${JSON.stringify({ bytes, ...row })}\n`);
}

function dropCaches(): void {
  const r = spawnSync('sh', ['-c', 'sync && echo 3 > /proc/sys/vm/drop_caches']);
  if (r.status !== 0) throw new Error(`cannot drop the page cache (needs root): ${r.stderr}`);
}

/** Wall clock of a fresh process from spawn to exit, from a dropped page cache. */
function coldWallMs(command: string, args: string[]): number {
  dropCaches();
  const t0 = performance.now();
  const r = spawnSync(command, args, { stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
  const ms = performance.now() - t0;
  if (r.status !== 0) throw new Error(`${command} ${args.slice(0, 2).join(' ')} exited ${r.status}: ${r.stderr}`);
  return ms;
}

async function coldReadyMs(run: number): Promise<number> {
  const socketDir = mkdtempSync(join(tmpdir(), 'wd-bench-cold-'));
  dropCaches();
  const d = await spawnUntilReady([...daemon, '--model', model, '--device', device, '--weight-cache-socket-dir', socketDir], { ...process.env, WEIGHTD_HOST_DEVICES: `cold-${process.pid}-${run}` });
  await d.stop(join(out, 'daemon.jsonl'), { run });
  rmSync(socketDir, { recursive: true, force: true });
  return d.wallMs;
}

const rows: Array<{ ready: number; cat: number; probes: number[] }> = [];
for (let run = 1; run <= runs; run++) {
  const ready = await coldReadyMs(run);
  record({ run, what: 'daemon spawn to READY', device, wallMs: ready });
  const cat = coldWallMs('sh', ['-c', 'cat "$@" > /dev/null', 'cat', ...files]);
  record({ run, what: 'cat > /dev/null', wallMs: cat });
  const probes = probeThreads.map((threads) => {
    const ms = coldWallMs(python, [join(repoRoot, 'bench/odirect-probe.py'), '--threads', String(threads), ...files]);
    record({ run, what: 'odirect-probe.py', threads, wallMs: ms });
    return ms;
  });
  rows.push({ ready, cat, probes });
}
const readyMs = median(rows.map((r) => r.ready));
const catMs = median(rows.map((r) => r.cat));
const probeMs = probeThreads.map((_, i) => median(rows.map((r) => r.probes[i]!)));
const bestProbeMs = Math.min(...probeMs);
const summary = {
  date: new Date().toISOString(),
  device,
  model,
  bytes,
  runs,
  readyWallMsMedian: readyMs,
  catWallMsMedian: catMs,
  probeWallMsMedian: Object.fromEntries(probeThreads.map((t, i) => [`${t} threads`, probeMs[i]])),
  readyGBps: bytes / readyMs / 1e6,
  catOverReady: catMs / readyMs,
  bestProbeOverReady: bestProbeMs / readyMs,
  targets: { catOverReady: '>= 1.0', bestProbeOverReady: '>= 0.9' },
};
writeFileSync(join(out, 'summary.json'), `${JSON.stringify(summary, null, 1)}\n`);
console.log(JSON.stringify(summary));
