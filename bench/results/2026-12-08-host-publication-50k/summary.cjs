// node summary.cjs DIR: per build, each run's medians without its first update, and the medians over runs.
const fs = require('fs'), path = require('path');
const dir = process.argv[2];
const med = (a) => { a = [...a].sort((x, y) => x - y); const n = a.length; return n % 2 ? a[n >> 1] : (a[n / 2 - 1] + a[n / 2]) / 2; };
for (const w of ['ref', 'new']) {
  const runs = fs.readdirSync(dir).filter((f) => f.startsWith(`${w}-`) && f.endsWith('.json')).sort().map((f) => JSON.parse(fs.readFileSync(path.join(dir, f))));
  const per = (k) => runs.map((r) => med(r[k].slice(1)));
  const line = ['beginMs', 'commitCallMs', 'publishMs', 'commitMs'].map((k) => `${k} ${per(k).map((x) => x.toFixed(1)).join('/')} (median ${med(per(k)).toFixed(1)})`);
  console.log(w, line.join('; '));
}
