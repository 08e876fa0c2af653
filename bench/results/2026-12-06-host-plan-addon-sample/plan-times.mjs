// Plans one checkpoint with the content sample in a pool of worker threads (the default) and
// with the addon's reader (a daemon's, src/native/sampleDigest.ts), alternating, in one process.
// node plan-times.mjs DIST_ROOT MODEL_DIR RUNS
import { pathToFileURL } from 'node:url';
const [root, model, runs = '6'] = process.argv.slice(2);
const { planCheckpoint } = await import(pathToFileURL(`${root}/src/checkpoint/planCheckpoint.js`).href);
const { sampleWithAddon } = await import(pathToFileURL(`${root}/src/native/sampleDigest.js`).href);
for (let i = 0; i < Number(runs); i++) {
  for (const [name, sampler] of [['pool', undefined], ['addon', sampleWithAddon]]) {
    const t = performance.now();
    const plan = await planCheckpoint(model, { tpSize: 1, sampler });
    console.log(JSON.stringify({ run: i, sampler: name, ms: Math.round((performance.now() - t) * 10) / 10, tensors: plan.ranks[0].tensors.length, fingerprint: plan.fingerprint }));
  }
}
