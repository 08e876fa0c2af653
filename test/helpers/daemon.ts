// Runs the daemon (node dist/main.js) as a child process for end-to-end tests: waits for its READY line, keeps
// its stderr for assertions, and guarantees it is killed when the test process ends, however it
// ends. Every daemon gets its own socket dir unless a test asks otherwise.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { mainJs, repoRoot } from './paths.js';

export interface DaemonOptions {
  model: string;
  tp?: number;
  /** Default host. */
  device?: 'host' | 'cuda';
  /** Passed as --weight-cache-socket-dir; omitted: the daemon's default dir (under TMPDIR). */
  socketDir?: string;
  /** Host device ids (WEIGHTD_HOST_DEVICES); default `<tag>-0..tp-1`, unique per daemon. */
  devices?: string[];
  env?: Record<string, string>;
  extraArgs?: string[];
  /** How long to wait for READY. */
  readyTimeoutMs?: number;
  /** Resolve startDaemon once stderr matches this instead of READY (a log event before it). */
  until?: RegExp;
  /** What node runs instead of dist/main.js: a fixture node of the same flags (test/rendezvous/fixtures/faultyNode.js). */
  script?: string;
  /** A program the daemon runs under, which must exec it (so the pid is the daemon's): ['prlimit', '--nofile=256:256']. */
  prefix?: string[];
  /** The Node.js binary that runs it; default the one running the tests (test/deploy/lowestNode runs another). */
  node?: string;
}

export interface Daemon {
  readonly pid: number;
  readonly devices: string[];
  /** stderr so far. */
  stderr(): string;
  /** Resolves once `done(stderr)` holds, checked on every stderr chunk (rejects at exit or after `ms`). */
  waitForStderr(what: string, done: (stderr: string) => boolean, ms?: number): Promise<void>;
  /** Resolves once stderr matches `pattern` (now or later); rejects if the daemon exits first or after `ms`. */
  waitFor(pattern: RegExp, ms?: number): Promise<void>;
  /** `signal` (SIGTERM), then SIGKILL after `graceMs`; resolves when it is gone (with its code or signal). */
  stop(graceMs?: number, signal?: NodeJS.Signals): Promise<Exit>;
  /** SIGKILL: no cleanup runs in the daemon (for stale socket/lock tests). */
  kill9(): Promise<void>;
  /** Open file descriptors of the daemon (/proc/<pid>/fd). */
  fdCount(): number;
}

/** The daemon's READY log line (JSON on a pipe, its msg starting with READY). */
export const READY_LINE = /"msg":"READY node /;

const live = new Set<ChildProcess>();
// Synchronous on purpose: 'exit' handlers cannot wait, and a daemon must never outlive a test.
process.on('exit', () => {
  for (const c of live) {
    try {
      c.kill('SIGKILL');
    } catch {
      // Already gone.
    }
  }
});

let counter = 0;

type Exit = { code: number | null; signal: NodeJS.Signals | null };

function spawnDaemon(opts: DaemonOptions): { child: ChildProcess; devices: string[]; out: { text: string }; waitExit: () => Promise<Exit> } {
  const tp = opts.tp ?? 1;
  const devices = opts.devices ?? Array.from({ length: tp }, (_, i) => `t${process.pid}-${counter}-${i}`);
  counter++;
  const args = [opts.script ?? mainJs, '--model', opts.model, '-tp', String(tp), '--device', opts.device ?? 'host', ...(opts.socketDir ? ['--weight-cache-socket-dir', opts.socketDir] : []), ...(opts.extraArgs ?? [])];
  const [command, ...prefixArgs] = [...(opts.prefix ?? []), opts.node ?? process.execPath];
  const child = spawn(command!, [...prefixArgs, ...args], {
    cwd: repoRoot,
    env: { ...process.env, WEIGHTD_HOST_DEVICES: devices.join(','), ...opts.env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  live.add(child);
  // Neither the child nor its stderr pipe may keep the test process alive: a test that fails
  // before stopping its daemon must still end, and the 'exit' hook above then kills the daemon.
  child.unref();
  (child.stderr as unknown as { unref(): void }).unref();
  const out = { text: '' };
  child.stderr!.on('data', (d: Buffer) => (out.text += d.toString()));
  // 'close', not 'exit': 'exit' may come before the last of stderr has been read, and tests
  // read the daemon's final lines (a summary written at stop) right after it is gone.
  const exitedUnref = new Promise<Exit>((resolve) => {
    child.on('close', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  // Whoever waits for the exit holds a reference meanwhile, or node could end with nothing left
  // to wait on but this unref'd child.
  const pipe = child.stderr as unknown as { ref(): void; unref(): void };
  const waitExit = () => {
    child.ref();
    pipe.ref();
    return exitedUnref.finally(() => (child.unref(), pipe.unref()));
  };
  return { child, devices, out, waitExit };
}

export async function startDaemon(opts: DaemonOptions): Promise<Daemon> {
  const { child, devices, out, waitExit } = spawnDaemon(opts);
  const timeoutMs = opts.readyTimeoutMs ?? 30_000;
  function waitForStderr(what: string, done: (stderr: string) => boolean, ms = 30_000): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const check = () => {
        if (!done(out.text)) return;
        cleanup();
        resolve();
      };
      const onExit = () => (cleanup(), reject(new Error(`daemon exited before ${what}; stderr tail:\n${out.text.slice(-2000)}`)));
      const timer = setTimeout(() => (cleanup(), reject(new Error(`no ${what} within ${ms} ms; stderr tail:\n${out.text.slice(-2000)}`))), ms);
      function cleanup() {
        clearTimeout(timer);
        child.stderr!.off('data', check);
        child.off('exit', onExit);
      }
      child.stderr!.on('data', check);
      child.on('exit', onExit);
      check();
    });
  }
  // A daemon that does not get ready is killed: the test fails and leaves no process behind.
  await waitForStderr('READY', (text) => (opts.until ?? READY_LINE).test(text), timeoutMs).catch((err: unknown) => {
    child.kill('SIGKILL');
    throw err;
  });
  const pid = child.pid!;
  return {
    pid,
    devices,
    stderr: () => out.text,
    waitForStderr,
    waitFor: (pattern, ms = 120_000) => waitForStderr(String(pattern), (text) => pattern.test(text), ms),
    async stop(graceMs = 10_000, signal: NodeJS.Signals = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill(signal);
        const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
        const result = await waitExit();
        clearTimeout(timer);
        return result;
      }
      return waitExit();
    },
    async kill9() {
      child.kill('SIGKILL');
      await waitExit();
    },
    fdCount: () => readdirSync(`/proc/${pid}/fd`).length,
  };
}

/** Runs a daemon that is expected to fail before READY; resolves with its exit and stderr. */
export async function expectDaemonFailure(opts: DaemonOptions, timeoutMs = 30_000): Promise<{ code: number | null; stderr: string; ms: number }> {
  const started = Date.now();
  const { child, out, waitExit } = spawnDaemon(opts);
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const { code } = await waitExit();
  clearTimeout(timer);
  if (READY_LINE.test(out.text)) throw new Error(`daemon became READY although it was expected to fail; stderr:\n${out.text}`);
  return { code, stderr: out.text, ms: Date.now() - started };
}
