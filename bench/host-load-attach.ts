// Host backend, one run, ratios against baselines measured in the same run:
//   fill:   the daemon filling its arena (tp=1 and tp=2) vs a plain sequential read of the same
//           files, page cache hot;
//   attach: a client mapping a whole resident rank vs reading that rank's bytes from disk.
// Usage: node dist/bench/host-load-attach.js [GiB=1]. Prints one JSON line.
import { closeSync, mkdtempSync, openSync, readSync, readdirSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { WeightdClient, expectedFingerprint } from '../src/client/index.js';
import { startNode } from '../src/startNode.js';
import { writeLlamaCheckpoint } from './llamaCheckpoint.js';

const gib = Number(process.argv[2] ?? 1);
// WEIGHTD_BENCH_DIR keeps the generated checkpoint there (reused when present) for reruns.
const keepDir = process.env.WEIGHTD_BENCH_DIR;
const dir = keepDir ?? mkdtempSync(join(tmpdir(), 'weightd-bench-'));
const socketDir = mkdtempSync(join(tmpdir(), 'weightd-bench-sock-'));

/** Reads every checkpoint file front to back in 16 MiB blocks; returns seconds. */
function sequentialRead(): number {
  const buf = Buffer.allocUnsafe(16 << 20);
  const t0 = performance.now();
  for (const f of readdirSync(dir).filter((n) => n.endsWith('.safetensors')).sort()) {
    const fd = openSync(join(dir, f), 'r');
    while (readSync(fd, buf, 0, buf.length, null) > 0);
    closeSync(fd);
  }
  return (performance.now() - t0) / 1000;
}

async function fill(tp: number) {
  const t0 = performance.now();
  const node = await startNode({ model: dir, tensorParallelSize: tp, device: 'host', socketDir, logger: pino({ level: 'silent' }) });
  const status = await node.ready;
  // Start to READY: planning, allocation (with its page population) and the fill.
  const seconds = (performance.now() - t0) / 1000;
  const bytes = status.ranks.reduce((a, r) => a + r.bytes, 0);
  return { node, status, seconds, bytes };
}

try {
  const total = await writeLlamaCheckpoint(dir, gib);
  sequentialRead(); // warm the page cache
  const readS = Math.min(sequentialRead(), sequentialRead());
  const readGBs = total / readS / 1e9;

  const one = await fill(1);
  const fill1GBs = one.bytes / one.seconds / 1e9;
  // Attach: map all of rank 0 and touch one byte per page, so the mapping is really usable.
  const expected = await expectedFingerprint(dir, 1, 0);
  const attachTimes: number[] = [];
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    const client = await WeightdClient.connect(one.status.ranks[0]!.socketPath!);
    const att = await client.attach(expected);
    if (att.status !== 'attached') throw new Error(`attach failed: ${JSON.stringify(att)}`);
    attachTimes.push(performance.now() - t0);
    await att.detach();
    await client.close();
  }
  await one.node.stop();
  const attachMs = attachTimes.sort((a, b) => a - b)[2]!;

  const two = await fill(2);
  const fill2GBs = two.bytes / two.seconds / 1e9;
  await two.node.stop();

  console.log(JSON.stringify({
    bench: 'host-load-attach',
    date: new Date().toISOString(),
    machine: `${cpus().length} cores, ${cpus()[0]?.model ?? 'unknown'}, node ${process.version}`,
    checkpointBytes: total,
    sequentialReadGBs: +readGBs.toFixed(2),
    fillTp1GBs: +fill1GBs.toFixed(2),
    fillTp1VsRead: +(fill1GBs / readGBs).toFixed(2),
    fillTp2GBs: +fill2GBs.toFixed(2),
    fillTp2VsRead: +(fill2GBs / readGBs).toFixed(2),
    attachMedianMs: +attachMs.toFixed(2),
    readRankFromDiskMs: +(readS * 1000).toFixed(1),
    attachSpeedupVsDisk: +((readS * 1000) / attachMs).toFixed(1),
  }));
} finally {
  for (const d of keepDir ? [socketDir] : [dir, socketDir]) rmSync(d, { recursive: true, force: true });
}
