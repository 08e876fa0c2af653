#!/usr/bin/env node
// Summarises fill-bench lines of fills without digests, with digests on the GPU and on the CPU
// (fill-digest.sh, fill-digest-pair.sh): per label and options, the median GB/s of each way, the
// ratios to without, the median of the per-block ratios (each block of GPU-digest fills against
// the block without just before it, so drift cancels), and the GPU digests' median setup and
// wait after the last copy (digestGpuSetupSeconds, digestGpuTailSeconds; absent from older builds).
//   node bench/gpu/fill-digest-summary.mjs FILL_JSONL SUMMARY_JSON
import * as fs from 'node:fs';

const [jsonl, summary] = process.argv.slice(2);
const lines = fs.readFileSync(jsonl, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const median = (a) => {
  const s = a.filter((x) => x !== null && x !== undefined).sort((x, y) => x - y);
  return s.length ? s[Math.floor(s.length / 2)] : null;
};
const base = (o) => {
  const { digest, digestOn, ...rest } = o;
  return JSON.stringify(rest);
};
const way = (o) => (!o.digest ? 'without' : o.digestOn === 'cpu' ? 'cpu' : 'gpu');
const runsOf = (l) =>
  l.results[0].runs.map((r) => ({
    gbps: l.payloadBytes / Math.max(...r.deviceSeconds) / 1e9,
    gpuBytes: r.digestGpuBytes?.[0] ?? 0,
    unavailable: r.digestGpuUnavailable?.[0] ?? null,
    setupMs: r.digestGpuSetupSeconds?.[0] == null ? null : r.digestGpuSetupSeconds[0] * 1e3,
    tailMs: r.digestGpuTailSeconds?.[0] == null ? null : r.digestGpuTailSeconds[0] * 1e3,
  }));

const out = {};
for (const label of new Set(lines.map((l) => l.label))) {
  const ofLabel = lines.filter((l) => l.label === label);
  for (const key of new Set(ofLabel.map((l) => base(l.results[0].options)))) {
    const blocks = ofLabel.filter((l) => base(l.results[0].options) === key);
    const of = (w) => blocks.filter((l) => way(l.results[0].options) === w).flatMap(runsOf);
    const [without, gpu, cpu] = ['without', 'gpu', 'cpu'].map(of);
    const gbps = (runs) => median(runs.map((r) => r.gbps));
    // Each GPU block against the block without that came last before it.
    const paired = [];
    let last = null;
    for (const l of blocks) {
      const w = way(l.results[0].options);
      if (w === 'without') last = gbps(runsOf(l));
      else if (w === 'gpu' && last) paired.push(gbps(runsOf(l)) / last);
    }
    out[`${label} ${key}`] = {
      fills: [without.length, gpu.length, cpu.length],
      medianGBpsWithout: gbps(without),
      medianGBpsGpuDigests: gbps(gpu),
      medianGBpsCpuDigests: gbps(cpu),
      ratioGpu: gbps(gpu) / gbps(without),
      ratioCpu: gbps(cpu) / gbps(without),
      blockRatiosGpu: { median: median(paired), min: Math.min(...paired), max: Math.max(...paired), blocks: paired.length },
      gpuSetupMsMedian: median(gpu.map((r) => r.setupMs)),
      gpuTailMsMedian: median(gpu.map((r) => r.tailMs)),
      gpuDigestBytes: gpu[0]?.gpuBytes,
      gpuUnavailable: [...new Set(gpu.map((r) => r.unavailable).filter(Boolean))],
    };
  }
}
out.target = 'ratioGpu >= 0.98 (hot)';
fs.writeFileSync(summary, JSON.stringify(out, null, 1));
console.log(JSON.stringify(out, null, 1));
