#!/usr/bin/env node
// Reads what bench/gpu/run.sh wrote to DIR and prints the headline figures as ratios against the
// same run's baselines, with the targets of issue 5 and whether each was met.
//   node bench/gpu/summarize.mjs DIR
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fillSeconds } from './gpuFleet.mjs';

const dir = process.argv[2];
// A step that failed leaves its file empty or missing: its figures are then null.
const json = (f) => {
  try {
    return JSON.parse(readFileSync(join(dir, f), 'utf8'));
  } catch {
    return null;
  }
};
// fill-bench writes a line per config; gather them per run label. GB/s are derived here from
// the reps' native seconds, so results written by older versions read the same way.
const fills = [];
const lines = existsSync(join(dir, 'fills.jsonl')) ? readFileSync(join(dir, 'fills.jsonl'), 'utf8').trim().split('\n').filter(Boolean) : [];
for (const line of lines.map((l) => JSON.parse(l))) {
  for (const r of line.results) {
    const { best, median } = fillSeconds(r.runs);
    Object.assign(r, { bestSeconds: best, medianSeconds: median, bestGBps: line.payloadBytes / best / 1e9, medianGBps: line.payloadBytes / median / 1e9 });
  }
  const run = fills.find((f) => f.label === line.label);
  if (!run) fills.push(line);
  else {
    run.results.push(...line.results);
    run.peakRssMiB = Math.max(run.peakRssMiB, line.peakRssMiB);
  }
}
const baselines = json('baselines.json') ?? {};
const cold = json('cold.json') ?? {};
const checks = json('gpu-check.json') ?? [];

const byLabel = (label) => fills.find((f) => f.label === label);
const best = (run, pred = () => true) => {
  const rs = (run?.results ?? []).filter((r) => pred(r.options));
  return rs.reduce((a, r) => (!a || r.bestGBps > a.bestGBps ? r : a), null);
};
const round = (x, d = 2) => (x == null || Number.isNaN(x) ? null : Number(x.toFixed(d)));

const hot = byLabel('hot-1gpu');
const hotPread = best(hot, (o) => (o.mode ?? 'pread') === 'pread');
const hotRegister = best(hot, (o) => o.mode === 'register');
const hotDefault = hot?.results?.[0];
const hotBest = [hotPread, hotRegister].filter(Boolean).sort((a, b) => b.bestGBps - a.bestGBps)[0];
const coldRun = byLabel('cold-1gpu');
const coldBest = best(coldRun);
// One GPU, the same default options, measured before and after the two-GPU runs: the better
// of the two is the baseline (machines of one kind differ by 20% from one lease to the next).
const one = [byLabel('hot-1gpu-same-config'), byLabel('hot-1gpu-again')].map((r) => best(r)).filter(Boolean).sort((a, b) => b.bestGBps - a.bestGBps)[0];
// Runs before 2026-11-30's node groups called the replicas run hot-2gpu-tp1.
const scenarios = { replicas: byLabel('hot-2gpu-replicas') ?? byLabel('hot-2gpu-tp1'), tp2: byLabel('hot-2gpu-tp2'), disjoint: byLabel('hot-2gpu-disjoint') };
const isGroup = (o) => o.group === true;
const twoGpus = scenarios.replicas && {
  oneGpuGBps: round(one?.bestGBps),
  // Aggregate GB/s of payload landed on both GPUs, an engine per GPU and one group for both.
  ...Object.fromEntries(Object.entries(scenarios).map(([name, run]) => {
    const separate = best(run, (o) => !isGroup(o));
    const group = best(run, isGroup);
    return [name, {
      separateGBps: round(separate?.bestGBps),
      groupGBps: round(group?.bestGBps),
      separateScaling: round(separate?.bestGBps / one?.bestGBps),
      groupScaling: round(group?.bestGBps / one?.bestGBps),
    }];
  })),
};

const summary = {
  ceilings: {
    pinnedH2DGBps: round(baselines.pinnedH2DGBps),
    pinnedH2DAllGpusGBps: round(baselines.pinnedH2DAllGpusGBps),
    loadFileGBps: round(baselines.loadFileGBps),
    coldSequentialReadGBps: round(cold.catGBps),
    coldDirectDdGBps: round(cold.ddDirectGBps),
  },
  hot: {
    defaultOptions: hotDefault && { options: hotDefault.options, GBps: round(hotDefault.bestGBps) },
    bestPread: hotPread && { options: hotPread.options, GBps: round(hotPread.bestGBps) },
    bestRegister: hotRegister && { options: hotRegister.options, GBps: round(hotRegister.bestGBps) },
    vsLoadFile: round(hotBest?.bestGBps / baselines.loadFileGBps),
    vsPinnedCeiling: round(hotBest?.bestGBps / baselines.pinnedH2DGBps),
    sweep: hot?.results?.map((r) => ({ options: r.options, bestGBps: round(r.bestGBps), medianGBps: round(r.medianGBps) })),
  },
  cold: {
    runs: coldRun?.results?.map((r) => ({ options: r.options, GBps: round(r.bestGBps), vsSequentialRead: round(r.bestGBps / cold.catGBps) })),
    bestVsSequentialRead: round(coldBest?.bestGBps / cold.catGBps),
  },
  twoGpus,
  // Peak RSS of each process; rss-* ran the default options alone (the others sweep options up
  // to 1 GiB of staging, which their peak includes).
  peakRssMiB: Object.fromEntries(fills.map((f) => [f.label, f.peakRssMiB])),
  correctness: { passed: checks.filter((c) => c.ok).length, failed: checks.filter((c) => !c.ok).map((c) => c.name) },
};
summary.targets = {
  'hot >= 20 GB/s': hotBest ? hotBest.bestGBps >= 20 : null,
  'hot >= 4x load_file': summary.hot.vsLoadFile == null ? null : summary.hot.vsLoadFile >= 4,
  'cold >= 0.9x sequential read': summary.cold.bestVsSequentialRead == null ? null : summary.cold.bestVsSequentialRead >= 0.9,
  'host RSS < 1 GiB loading 16 GB (default options, two GPUs x the checkpoint)': byLabel('rss-2gpu') ? byLabel('rss-2gpu').peakRssMiB < 1024 : null,
  // Judged on the default options, as the daemon fills a node's GPUs (one group).
  '2 GPUs >= 1.7x one: each the whole checkpoint': twoGpus?.replicas?.groupScaling == null ? null : twoGpus.replicas.groupScaling >= 1.7,
  '2 GPUs >= 1.7x one: tp=2, each its rank': twoGpus?.tp2?.groupScaling == null ? null : twoGpus.tp2.groupScaling >= 1.7,
};
console.log(JSON.stringify(summary, null, 1));
