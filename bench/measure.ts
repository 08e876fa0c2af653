// What more than one benchmark measures the same way: a daemon's wall clock from spawn to its
// READY line, a process's peak RSS from its own /proc, the first attach in a fresh Python
// process, and the median of a run's figures.
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../test/helpers/paths.js';

export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Peak resident memory of a live process, in bytes (VmHWM of its /proc status). */
export function peakRss(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
}

/** A fresh Python process attaching twice (first and warm) to rank 0, timed inside it, in ms. */
export function attachInFreshProcess(socketDir: string, device: string): { firstMs: number; secondMs: number; tensors: number } {
  const python = process.env.WEIGHTD_PYTHON ?? 'python3';
  const script = `
import json, sys, time
import torch  # an engine has torch loaded, and its CUDA context made, before it attaches
${device === 'cuda' ? 'torch.zeros(1, device="cuda:0")' : ''}
from weightd_client import WeightdClient, find_socket
c = WeightdClient(find_socket(global_rank=0, socket_dir=sys.argv[1]))
fp = c.ping()["fingerprint"]
t0 = time.perf_counter(); a = c.attach(fp); t1 = time.perf_counter()
n = len(a.tensors); a.detach()
t2 = time.perf_counter(); b = c.attach(fp); t3 = time.perf_counter(); b.detach()
print(json.dumps({"firstMs": (t1 - t0) * 1e3, "secondMs": (t3 - t2) * 1e3, "tensors": n}))
`;
  const r = spawnSync(python, ['-c', script, socketDir], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: [join(repoRoot, 'clients/python'), process.env.PYTHONPATH].filter(Boolean).join(':') } });
  if (r.status !== 0) throw new Error(`attach failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!) as { firstMs: number; secondMs: number; tensors: number };
}

export interface ReadyDaemon {
  /** Spawn to the READY line, in ms. */
  wallMs: number;
  pid: number;
  /** Its log lines so far, parsed (JSON lines off a terminal). */
  lines(): Array<{ msg: string; sinceStartMs: number } & Record<string, unknown>>;
  /** SIGTERM, then appends every log line, with `tag`'s fields, to `logFile`. */
  stop(logFile: string, tag: Record<string, unknown>): Promise<void>;
}

/** Spawns `command` (a daemon) and resolves at its READY line; rejects if it exits before. */
export function spawnUntilReady(command: string[], env: NodeJS.ProcessEnv): Promise<ReadyDaemon> {
  const t0 = performance.now();
  const child = spawn(command[0]!, command.slice(1), { stdio: ['ignore', 'ignore', 'pipe'], env });
  const exited = new Promise<void>((done) => child.on('close', () => done()));
  let log = '';
  const lines = () => log.trim().split('\n').map((l) => JSON.parse(l) as { msg: string; sinceStartMs: number } & Record<string, unknown>);
  return new Promise((resolveReady, reject) => {
    child.on('close', (code) => reject(new Error(`daemon exited ${code} before READY:\n${log}`)));
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      const wasReady = log.includes('"ready":true');
      log += d;
      if (wasReady || !log.includes('"ready":true')) return;
      resolveReady({
        wallMs: performance.now() - t0,
        pid: child.pid!,
        lines,
        stop: async (logFile, tag) => {
          child.kill('SIGTERM');
          await exited;
          // Each daemon line as it wrote it, with the run it belongs to.
          appendFileSync(logFile, lines().map((l) => `${JSON.stringify({ ...tag, ...l })}\n`).join(''));
        },
      });
    });
  });
}
