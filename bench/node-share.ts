// What each node of a tp=8 cluster with one GPU per node reads on a start, against its share of
// the checkpoint (issue 15: "≤ 1.1x its share"), simulated with eight daemons on the host backend
// over loopback (--nnodes 8 --node-rank i, one host device each), timed and counted the same way
// for each build in the same run:
//   share:      the payload of the node's rank (its plan's totalBytes), and the 4 KiB pages its
//               copy ops touch (what a read through the page cache fetches at least);
//   rchar:      every byte the daemon's read calls returned (/proc/<pid>/io), its own modules and
//               the checkpoint's headers and fingerprint sample included;
//   read_bytes: what the block layer read for it. For the cold runs each node has its own copy of
//               the checkpoint (a page cache of its own, as separate machines have; the
//               fingerprint does not cover the directory) and every copy is evicted first
//               (dd iflag=nocache), while Node's own files stay cached: read_bytes is then the
//               checkpoint bytes that node fetched from the disk.
// The hot runs share one directory whose files are in the page cache; rchar counts the same.
// Usage: node dist/bench/node-share.js --out DIR [--gib 2] [--dir CKPT] [--baseline ROOT]
//        [--runs 1] [--modes cold,hot]
//   --baseline: the root of another checkout, built (dist/main.js and its addon): its daemons run
//               as the "before" variant, this tree's as "after".
// Writes raw.jsonl (a line per node per run), daemon.jsonl (their logs) and summary.json into
// --out, a new folder.
import { spawnSync } from 'node:child_process';
import { appendFileSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { planCheckpoint } from '../src/checkpoint/planCheckpoint.js';
import type { RankPlan } from '../src/checkpoint/types.js';
import { mainJs } from '../test/helpers/paths.js';
import { LLAMA_8B_LAYER, writeLlamaCheckpoint } from './llamaCheckpoint.js';
import { median, spawnUntilReady, type ReadyDaemon } from './measure.js';

const { values: args } = parseArgs({
  options: {
    out: { type: 'string' },
    gib: { type: 'string', default: '2' },
    dir: { type: 'string', default: resolve('bench/out/node-share-ckpt') },
    baseline: { type: 'string' },
    runs: { type: 'string', default: '1' },
    modes: { type: 'string', default: 'cold,hot' },
  },
});
if (!args.out) throw new Error('--out DIR is required (a new folder for the raw files)');
if (existsSync(args.out)) throw new Error(`${args.out} exists: every run goes into a new folder`);
mkdirSync(args.out, { recursive: true });

const NNODES = 8;
const PAGE = 4096;
const dir = resolve(args.dir);
const modes = args.modes.split(',') as Array<'cold' | 'hot'>;
const variants: Array<{ name: string; main: string }> = [
  ...(args.baseline ? [{ name: 'before', main: join(resolve(args.baseline), 'dist', 'main.js') }] : []),
  { name: 'after', main: mainJs },
];

const safetensors = (d: string) => readdirSync(d).filter((f) => f.endsWith('.safetensors') || f.endsWith('.json')).sort();

/** Node i's own copy of the checkpoint (made once, reused while its files have the same sizes). */
function nodeCopy(i: number): string {
  const copy = `${dir}-node${i}`;
  mkdirSync(copy, { recursive: true });
  for (const f of safetensors(dir)) {
    const from = join(dir, f);
    const to = join(copy, f);
    if (!existsSync(to) || statSync(to).size !== statSync(from).size) copyFileSync(from, to);
  }
  return copy;
}

/** Drops the files from the page cache; returns the bytes still cached afterwards (fincore). */
function evict(d: string): number {
  let cached = 0;
  for (const f of safetensors(d)) {
    const p = join(d, f);
    spawnSync('dd', [`if=${p}`, 'iflag=nocache', 'count=0', 'status=none']);
    const r = spawnSync('fincore', ['--bytes', '--noheadings', '--raw', '--output', 'RES', p], { encoding: 'utf8' });
    cached += Number(r.stdout.trim() || 0);
  }
  return cached;
}

function warm(d: string): void {
  for (const f of safetensors(d)) spawnSync('cat', [join(d, f)], { stdio: ['ignore', 'ignore', 'inherit'], maxBuffer: 1 });
}

/** 4 KiB pages the rank's ops touch, per file, counted once. */
function pagesTouched(rank: RankPlan): number {
  const byFile = new Map<number, Array<[number, number]>>();
  for (const op of rank.ops) {
    const list = byFile.get(op.file) ?? [];
    for (let r = 0; r < op.rows; r++) {
      const s = op.srcOffset + r * op.srcPitch;
      list.push([Math.floor(s / PAGE), Math.ceil((s + op.rowBytes) / PAGE)]);
    }
    byFile.set(op.file, list);
  }
  let pages = 0;
  for (const list of byFile.values()) {
    list.sort((a, b) => a[0] - b[0]);
    let end = -1;
    for (const [s, e] of list) {
      if (e <= end) continue;
      pages += e - Math.max(s, end);
      end = e;
    }
  }
  return pages;
}

function procIo(pid: number): { rchar: number; readBytes: number } {
  const text = readFileSync(`/proc/${pid}/io`, 'utf8');
  const field = (k: string) => Number(new RegExp(`${k}: (\\d+)`).exec(text)![1]);
  return { rchar: field('rchar'), readBytes: field('read_bytes') };
}

const total = await writeLlamaCheckpoint(dir, Number(args.gib), LLAMA_8B_LAYER);
const plan = await planCheckpoint(dir, { tpSize: NNODES });
const shares = plan.ranks.map((r) => ({ payload: r.totalBytes, pageFloor: pagesTouched(r) * PAGE }));
const copies = modes.includes('cold') ? Array.from({ length: NNODES }, (_, i) => nodeCopy(i)) : [];
const raw = join(args.out, 'raw.jsonl');
const logs = join(args.out, 'daemon.jsonl');
const socketRoot = mkdtempSync(join(tmpdir(), 'weightd-node-share-'));

try {
  for (let run = 0; run < Number(args.runs); run++) {
    for (const mode of modes) {
      for (const variant of variants) {
        const dirs = mode === 'cold' ? copies : Array.from({ length: NNODES }, () => dir);
        const stillCached = mode === 'cold' ? dirs.reduce((a, d) => a + evict(d), 0) : (warm(dir), 0);
        const port = 20000 + Math.floor(Math.random() * 20000);
        const t0 = performance.now();
        const daemons: ReadyDaemon[] = await Promise.all(dirs.map((model, i) => {
          const socketDir = mkdtempSync(join(socketRoot, `n${i}-`));
          return spawnUntilReady([
            process.execPath, variant.main, '--model', model, '--device', 'host', '--tensor-parallel-size', String(NNODES), '--nnodes', String(NNODES),
            '--node-rank', String(i), '--master-addr', '127.0.0.1', '--weight-cache-master-port', String(port), '--weight-cache-socket-dir', socketDir,
            '--rendezvous-timeout', '300',
          ], { ...process.env, WEIGHTD_HOST_DEVICES: `node${i}-dev0` });
        }));
        const allReadyMs = performance.now() - t0;
        for (const [i, d] of daemons.entries()) {
          const io = procIo(d.pid);
          const loaded = d.lines().find((l) => /^rank \d+ loaded /.test(l.msg));
          appendFileSync(raw, `${JSON.stringify({
            run, mode, variant: variant.name, node: i, ...io, ...shares[i]!, ...d.memory(), readyMs: Math.round(d.wallMs),
            fillSeconds: loaded?.seconds, stillCachedBeforeStart: stillCached,
          })}\n`);
        }
        appendFileSync(raw, `${JSON.stringify({ run, mode, variant: variant.name, allReadyMs: Math.round(allReadyMs) })}\n`);
        await Promise.all(daemons.map((d, i) => d.stop(logs, { run, mode, variant: variant.name, node: i })));
      }
    }
  }

  type Row = { mode: string; variant: string; node?: number; rchar: number; readBytes: number; payload: number; pageFloor: number; readyMs: number; fillSeconds?: number; peakRssAnon: number; vmHwm: number; allReadyMs?: number };
  const rows = readFileSync(raw, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Row);
  const summary: Record<string, unknown> = {
    bench: 'node-share',
    date: new Date().toISOString(),
    machine: `${cpus().length} cores, ${cpus()[0]?.model ?? 'unknown'}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, node ${process.version}`,
    checkpoint: { dir, bytes: total, tensors: plan.ranks[0]!.tensors.length, shape: LLAMA_8B_LAYER },
    nnodes: NNODES,
    shares,
  };
  for (const mode of modes) {
    for (const variant of variants) {
      const nodes = rows.filter((r) => r.mode === mode && r.variant === variant.name && r.node !== undefined);
      const ratio = (k: 'rchar' | 'readBytes') => nodes.map((r) => r[k] / r.payload);
      summary[`${mode}/${variant.name}`] = {
        rcharOverShare: { median: +median(ratio('rchar')).toFixed(3), max: +Math.max(...ratio('rchar')).toFixed(3) },
        readBytesOverShare: { median: +median(ratio('readBytes')).toFixed(3), max: +Math.max(...ratio('readBytes')).toFixed(3) },
        pageFloorOverShare: +median(nodes.map((r) => r.pageFloor / r.payload)).toFixed(3),
        allReadyMs: rows.filter((r) => r.mode === mode && r.variant === variant.name && r.allReadyMs !== undefined).map((r) => r.allReadyMs),
        fillSecondsMedian: median(nodes.map((r) => r.fillSeconds ?? NaN)),
        peakRssAnonMiBMax: +(Math.max(...nodes.map((r) => r.peakRssAnon)) / 2 ** 20).toFixed(1),
        vmHwmMiBMax: +(Math.max(...nodes.map((r) => r.vmHwm)) / 2 ** 20).toFixed(1),
      };
    }
  }
  writeFileSync(join(args.out, 'summary.json'), `${JSON.stringify(summary, null, 2)}\n`);
  console.log(JSON.stringify(summary));
} finally {
  rmSync(socketRoot, { recursive: true, force: true });
}
