// Paired READY by tp (bench/ready.ts summary.json of base-N and after-N), and cp's baseline.
const fs = require('fs');
const med = (a) => { a = [...a].sort((x, y) => x - y); const n = a.length; return n % 2 ? a[n >> 1] : (a[n / 2 - 1] + a[n / 2]) / 2; };
const get = (w, i) => JSON.parse(fs.readFileSync(`${w}-${i}/summary.json`));
const pairs = [];
for (let i = 1; fs.existsSync(`base-${i}/summary.json`); i++) pairs.push([get('base', i), get('after', i)]);
for (const tp of ['1', '2']) {
  const b = pairs.map((p) => p[0].byTp[tp].readyWallMsMedian), a = pairs.map((p) => p[1].byTp[tp].readyWallMsMedian);
  console.log(`tp=${tp} READY base ${b.map((x) => x.toFixed(0)).join(' ')} | after ${a.map((x) => x.toFixed(0)).join(' ')}`);
  console.log(`  medians ${med(b).toFixed(1)} / ${med(a).toFixed(1)}, best ${Math.min(...b).toFixed(0)} / ${Math.min(...a).toFixed(0)}, paired ${med(a.map((x, i) => x - b[i])).toFixed(1)} ms, after faster in ${a.filter((x, i) => x < b[i]).length} of ${a.length}`);
}
const cp = pairs.flatMap((p) => [p[0].baselineWallMsBest, p[1].baselineWallMsBest]);
console.log(`cp best ${Math.min(...cp).toFixed(0)} ms, median ${med(cp).toFixed(0)}`);
for (const w of [0, 1]) {
  const t1 = med(pairs.map((p) => p[w].byTp['1'].readyWallMsMedian)), t2 = med(pairs.map((p) => p[w].byTp['2'].readyWallMsMedian));
  console.log(`${w ? 'after' : 'base'}: tp=2/tp=1 medians ${(t2 / t1).toFixed(3)}; cp best / tp=1 best ${(Math.min(...cp) / Math.min(...pairs.map((p) => p[w].byTp['1'].readyWallMsMedian))).toFixed(3)}`);
}
