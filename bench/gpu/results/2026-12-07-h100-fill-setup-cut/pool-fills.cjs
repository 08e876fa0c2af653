// Pooled over rounds: each build's median fill seconds without and with GPU digests, and the ratio of GB/s (with / without).
const fs = require('fs');
const med = (a) => { a = [...a].sort((x, y) => x - y); const n = a.length; return n % 2 ? a[n >> 1] : (a[n / 2 - 1] + a[n / 2]) / 2; };
const by = {};
for (const f of process.argv.slice(2)) for (const line of fs.readFileSync(f, 'utf8').trim().split('\n')) {
  const l = JSON.parse(line); const b = l.label.split('-')[0];
  for (const r of l.results) for (const run of r.runs) {
    const k = r.options.digest ? 'with' : 'without';
    ((by[b] ??= { with: [], without: [], setup: [] })[k]).push(run.deviceSeconds[0]);
    if (r.options.digest) by[b].setup.push(run.digestGpuSetupSeconds[0]);
  }
}
for (const [b, v] of Object.entries(by)) {
  const w = med(v.with), wo = med(v.without);
  console.log(`${b}: fills ${v.without.length} without, ${v.with.length} with; median ${(wo * 1e3).toFixed(2)} / ${(w * 1e3).toFixed(2)} ms; ratio ${(wo / w).toFixed(4)}; setup median ${(med(v.setup) * 1e3).toFixed(2)} ms`);
}
