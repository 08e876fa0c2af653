// What more than one benchmark measures the same way: a daemon's wall clock from spawn to its
// READY line, a process's memory from its own /proc (peak RSS, and its own heap apart from a
// mapped arena), the first attach in a fresh Python
// process, and the median of a run's figures.
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../test/helpers/paths.js';

export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/**
 * A live process's memory from its own /proc status, in bytes. vmHwm is its peak resident set,
 * which on the host backend counts the shared-memory arena it maps (every page a fill writes);
 * rssAnon is its own heap and stacks now, which is what "daemon RSS" means there.
 */
export function processMemory(pid: number): { vmHwm: number; rssAnon: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kB = (key: string) => {
    const m = new RegExp(`${key}:\\s+(\\d+) kB`).exec(status);
    return m ? Number(m[1]) * 1024 : NaN;
  };
  return { vmHwm: kB('VmHWM'), rssAnon: kB('RssAnon') };
}

/** How often a daemon's RssAnon is sampled: /proc keeps no peak of it. */
const RSS_SAMPLE_MS = 25;

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
  /**
   * Its VmHWM and RssAnon now, and the highest RssAnon sampled (every RSS_SAMPLE_MS) since it
   * was spawned: the peak of its own heap, the arena left out.
   */
  memory(): { vmHwm: number; rssAnon: number; peakRssAnon: number };
  /** Its log lines so far, parsed (JSON lines off a terminal). */
  lines(): Array<{ msg: string; sinceStartMs: number } & Record<string, unknown>>;
  /** SIGTERM, then appends every log line, with `tag`'s fields, to `logFile`. */
  stop(logFile: string, tag: Record<string, unknown>): Promise<void>;
}

/** Spawns `command` (a daemon) and resolves at its READY line; rejects if it exits before. */
export function spawnUntilReady(command: string[], env: NodeJS.ProcessEnv): Promise<ReadyDaemon> {
  const t0 = performance.now();
  const child = spawn(command[0]!, command.slice(1), { stdio: ['ignore', 'ignore', 'pipe'], env });
  let peakRssAnon = 0;
  const sample = () => {
    try {
      peakRssAnon = Math.max(peakRssAnon, processMemory(child.pid!).rssAnon || 0);
      return true;
    } catch {
      return false; // it has exited
    }
  };
  const sampler = setInterval(sample, RSS_SAMPLE_MS);
  const exited = new Promise<void>((done) => child.on('close', () => (clearInterval(sampler), done())));
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
        memory: () => {
          sample();
          return { ...processMemory(child.pid!), peakRssAnon };
        },
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
