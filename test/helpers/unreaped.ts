// A process whose parent never reaps it, so that once it exits it stays a zombie (state Z in
// /proc/<pid>/stat) until released, as a daemon killed with SIGKILL does in a container whose
// PID 1 reaps slowly. Node reaps its own children at once, so the parent is a small Python
// process: it spawns the command, waits for it to exit with WNOWAIT (which leaves the zombie in
// place, and tells exactly when it is one), and reaps it only when its stdin closes.
import { spawn } from 'node:child_process';

const PARENT = `
import os, sys
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
print(pid, flush=True)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
print("zombie", flush=True)
sys.stdin.read()
`;

export interface Unreaped {
  /** The command's pid (not its parent's). */
  readonly pid: number;
  /** The command's stderr so far (it writes to its parent's, which this reads). */
  stderr(): string;
  /** Resolves once stderr matches `pattern`; rejects if the parent ends first. */
  waitFor(pattern: RegExp): Promise<void>;
  /** Resolves once the command has exited and is a zombie. */
  readonly zombie: Promise<void>;
  /** Lets the parent reap the command and end (kill the command first if it still runs). */
  release(): Promise<void>;
}

/** Runs `argv` (argv[0] a path) as the child of a parent that does not reap it. */
export async function spawnUnreaped(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<Unreaped> {
  const parent = spawn(process.env.WEIGHTD_PYTHON ?? 'python3', ['-c', PARENT, ...argv], { env, stdio: ['pipe', 'pipe', 'pipe'] });
  const ended = new Promise<void>((resolve) => parent.on('close', () => resolve()));
  let out = '';
  let err = '';
  const watchers = new Set<() => void>();
  parent.stdout.on('data', (d: Buffer) => ((out += d.toString()), watchers.forEach((w) => w())));
  parent.stderr.on('data', (d: Buffer) => ((err += d.toString()), watchers.forEach((w) => w())));
  const until = (what: string, done: () => boolean) =>
    new Promise<void>((resolve, reject) => {
      const check = () => done() && (watchers.delete(check), resolve());
      watchers.add(check);
      void ended.then(() => watchers.has(check) && (watchers.delete(check), reject(new Error(`the unreaping parent ended before ${what}; stderr:\n${err.slice(-2000)}`))));
      check();
    });
  await until('the command started', () => /^\d+\n/.test(out));
  const pid = Number(out.split('\n')[0]);
  return {
    pid,
    stderr: () => err,
    waitFor: (pattern) => until(String(pattern), () => pattern.test(err)),
    zombie: until('the command exited', () => out.includes('zombie\n')),
    async release() {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // Already exited (a zombie, or reaped).
      }
      parent.stdin.end();
      await ended;
    },
  };
}
