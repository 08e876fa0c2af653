// A weightd-keeper for one test: the real binary on a fresh private socket, its stderr kept for
// assertions, killed when the test (or, failing that, the test process) ends. Also memfds for
// tests to keep (Node has no memfd_create: a Python child makes one and the test reopens it
// through /proc), and waits that poll for an event under a generous bound, never a fixed sleep.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KeeperClient, keeperBinaryPath } from '../../src/keeper/keeperClient.js';
import { isProcessAlive } from '../../src/wire/processLiveness.js';

const live = new Set<ChildProcess>();
/** Keepers a daemon spawned (--keeper spawn): detached from the test, which must never leave one behind. */
const spawnedKeepers = new Set<number>();
// Synchronous on purpose: 'exit' handlers cannot wait.
process.on('exit', () => {
  for (const c of live) c.kill('SIGKILL');
  for (const pid of spawnedKeepers) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
});

/** The pid of the keeper answering `keeper`, remembered so that the test process kills it at exit. */
export async function keeperPid(keeper: KeeperClient): Promise<number> {
  const { pid } = await keeper.ping();
  spawnedKeepers.add(pid);
  return pid;
}

/** Kills the keeper answering `keeper` (one a daemon spawned), if any, and waits until it is gone. */
export async function killKeeper(keeper: KeeperClient): Promise<void> {
  const pid = await keeperPid(keeper).catch(() => undefined);
  if (pid === undefined) return;
  process.kill(pid, 'SIGKILL');
  await waitUntil(`keeper ${pid} gone`, () => !processAlive(pid));
  spawnedKeepers.delete(pid);
}

export interface TestKeeper {
  pid: number;
  socket: string;
  dir: string;
  client: KeeperClient;
  stderr(): string;
  /** Resolves with how it ended. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(): Promise<void>;
}

/** Whether a process of this pid runs, by the daemon's own rule (docs/spec/liveness.md): an exited keeper that its adoptive parent has not reaped yet is gone. */
export function processAlive(pid: number): boolean {
  return isProcessAlive({ pid });
}

/** Polls `check` every 10 ms until it returns true; fails after `boundMs` naming `what` (a function: what was last seen). */
export async function waitUntil(what: string | (() => string), check: () => boolean | Promise<boolean>, boundMs = 20_000): Promise<void> {
  const deadline = Date.now() + boundMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${boundMs} ms waiting until ${typeof what === 'string' ? what : what()}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * Starts the keeper binary with `args` (besides --socket) and waits for its "keeper serving" log
 * line, written once it listens. `prefix` runs it through another program (setpriv, which execs
 * it, so the pid is the keeper's); `binary` is another build of it (build-asan's).
 */
export async function startTestKeeper(args: string[] = [], options: { dir?: string; prefix?: string[]; binary?: string } = {}): Promise<TestKeeper> {
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  const socket = join(dir, 'keeper.sock');
  const argv = [...(options.prefix ?? []), options.binary ?? keeperBinaryPath, '--socket', socket, ...args];
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] });
  live.add(child);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  let ended = false;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => {
      ended = true;
      live.delete(child);
      resolve({ code, signal });
    }),
  );
  await waitUntil(`the keeper listens on ${socket}`, () => {
    if (ended) throw new Error(`the keeper exited before serving: ${stderr}`);
    return stderr.includes('"msg":"keeper serving"');
  });
  return {
    pid: child.pid!,
    socket,
    dir,
    client: new KeeperClient(socket),
    stderr: () => stderr,
    exited,
    kill: async () => {
      if (!ended) child.kill('SIGKILL');
      await exited;
      if (!options.dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A fresh memfd holding `content`, opened read-write in this process (the caller closes it).
 * Its name, readable as /proc/self/fd/N -> "/memfd:weightd-test (deleted)", says what it is.
 */
export async function memfdWith(content: Buffer): Promise<number> {
  const script = 'import os,sys\nfd=os.memfd_create("weightd-test")\nos.write(fd, bytes.fromhex(sys.argv[1]))\nprint(fd, flush=True)\nsys.stdin.read()';
  const python = spawn(process.env.WEIGHTD_PYTHON ?? 'python3', ['-c', script, content.toString('hex')], { stdio: ['pipe', 'pipe', 'inherit'] });
  live.add(python);
  const exited = new Promise((resolve) => python.on('exit', resolve));
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    python.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('\n')) resolve(out.trim());
    });
    python.on('exit', (code) => reject(new Error(`the memfd helper exited ${code} before making one`)));
  });
  const fd = openSync(`/proc/${python.pid}/fd/${line}`, 'r+');
  python.stdin!.end();
  await exited;
  live.delete(python);
  return fd;
}

/** A process's open fds by kind: its memfds, sockets, pidfds and anything else. */
export function fdKinds(pid: number | 'self'): { memfd: number; socket: number; pidfd: number; other: number } {
  const kinds = { memfd: 0, socket: 0, pidfd: 0, other: 0 };
  for (const name of readdirSync(`/proc/${pid}/fd`)) {
    let target: string;
    try {
      target = readlinkSync(`/proc/${pid}/fd/${name}`);
    } catch {
      continue; // closed while listed
    }
    if (target.startsWith('/memfd:')) kinds.memfd++;
    else if (target.startsWith('socket:')) kinds.socket++;
    else if (target === 'anon_inode:[pidfd]') kinds.pidfd++;
    else kinds.other++;
  }
  return kinds;
}
