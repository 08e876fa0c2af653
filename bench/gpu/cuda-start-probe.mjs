// Where a cuda daemon's start waits on the driver (issue 33): one fresh process per run, times on
// the process's own clock (performance.now(), from its start), one JSON line per run.
//   node bench/gpu/cuda-start-probe.mjs probe       the addon's load, then cudaProbe() alone
//   node bench/gpu/cuda-start-probe.mjs warm        warmCuda(1, STAGING) and cudaProbe() at once, as main.ts
//                                                   and the node's devices do
//   node bench/gpu/cuda-start-probe.mjs warm0       the same with no pinned staging
// STAGING: WEIGHTD_PROBE_STAGING bytes (default 32 MiB, a one-GPU hot fill's).
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const mode = process.argv[2] ?? 'probe';
const t = () => Math.round(performance.now() * 10) / 10;
const row = { mode, start: t() };
const addon = createRequire(import.meta.url)(fileURLToPath(new URL('../../build/Release/weightd.node', import.meta.url)));
row.addonLoaded = t();
const staging = Number(process.env.WEIGHTD_PROBE_STAGING ?? 32 * 1024 * 1024);
const warm = mode === 'probe' ? undefined : addon.warmCuda(1, mode === 'warm0' ? 0 : staging).then(() => (row.warmDone = t()));
const probe = await addon.cudaProbe();
row.probeDone = t();
row.gpus = probe.devices?.length ?? 0;
await warm;
if (warm) addon.endCudaWarmup();
row.end = t();
console.log(JSON.stringify(row));
