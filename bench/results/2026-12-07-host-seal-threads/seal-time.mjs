import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const a = require(process.argv[2]);
const n = +process.argv[3], per = Math.floor(1073741824 / n / 4096) * 4096;
const out = [];
for (let r = 0; r < 5; r++) {
  const d = new a.Device('host', 0, { uuid: `seal-${process.pid}-${r}` });
  await d.allocate(Array(n).fill(per));
  const t = performance.now(); d.exportSegments(); out.push(+(performance.now() - t).toFixed(1));
  await d.free();
}
console.log(process.argv[2].includes('ref0') ? 'ref' : 'new', n, 'segments, export ms', out.join(' '));
