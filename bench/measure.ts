// What more than one benchmark measures the same way: a process's peak RSS from its own /proc,
// the first attach in a fresh Python process, and the median of a run's figures.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
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
