// What more than one benchmark measures the same way: a daemon's wall clock from spawn to its
// READY line, a process's memory from its own /proc (peak RSS, and its own heap apart from a
// mapped arena), the first attach in a fresh Python
// process, and the median of a run's figures.
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { exampleModel, mainJs, repoRoot } from '../test/helpers/paths.js';

export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** The flags every daemon benchmark takes, as parseArgs gives them. */
export interface BenchFlags {
  out?: string;
  model?: string;
  device?: string;
  runs?: string;
}

/**
 * A benchmark's run made real from its flags: --out a new folder (every run keeps its own, never
 * an old one; `kind` names it in the example), the model's safetensors files and their bytes, and
 * the daemon's command (WEIGHTD_BIN, e.g. an unpacked bundle's bin/weightd, else dist/main.js).
 */
export function benchRun(values: BenchFlags, kind: string) {
  if (!values.out) throw new Error(`--out DIR is required (a new folder, e.g. bench/results/<date>-<machine>-${kind})`);
  const out = resolve(values.out);
  if (existsSync(out)) throw new Error(`${out} exists: every run gets a new folder, never an old one`);
  mkdirSync(out, { recursive: true });
  const model = resolve(values.model ?? exampleModel);
  const files = readdirSync(model).filter((f) => f.endsWith('.safetensors')).map((f) => join(model, f));
  return {
    out,
    model,
    device: values.device ?? 'host',
    runs: Number(values.runs ?? '3'),
    files,
    bytes: files.reduce((n, f) => n + statSync(f).size, 0),
    daemon: process.env.WEIGHTD_BIN ? [process.env.WEIGHTD_BIN] : [process.execPath, mainJs],
    python: process.env.WEIGHTD_PYTHON ?? 'python3',
  };
}

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

/** CPU time of a live process so far, all threads (those that have ended too), in ms (ticks of 10 ms). */
export function processCpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}

/** How often a daemon's RssAnon is sampled: /proc keeps no peak of it. */
const RSS_SAMPLE_MS = 25;

/** A fresh Python process attaching twice (first and warm) to rank 0, timed inside it, in ms. */
export function attachInFreshProcess(socketDir: string, device: string): { firstMs: number; secondMs: number; tensors: number } {
  const python = process.env.WEIGHTD_PYTHON ?? 'python3';
  const r = spawnSync(python, [join(repoRoot, 'bench/attach-once.py'), socketDir, device], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: [join(repoRoot, 'clients/python'), process.env.PYTHONPATH].filter(Boolean).join(':') } });
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
