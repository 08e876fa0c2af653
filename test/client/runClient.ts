// Runs the TypeScript or the Python test client as its own process and returns its JSON line.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import type { Expected } from '../../src/client/index.js';
import { repoRoot } from '../helpers/paths.js';

/** python: tensor_format auto (torch: the venv has it); python-numpy; python-memoryview: the stdlib-only path. */
export type ClientLanguage = 'ts' | 'python' | 'python-numpy' | 'python-memoryview';

const PYTHON_FORMAT: Record<Exclude<ClientLanguage, 'ts'>, string> = { python: 'auto', 'python-numpy': 'numpy', 'python-memoryview': 'memoryview' };

/** test/run.mjs sets it (scripts/python-venv.mjs); clients/python is installed there, as in an engine. */
export const PYTHON = process.env.WEIGHTD_PYTHON ?? join(repoRoot, '.venv/bin/python');

function command(lang: ClientLanguage, args: string[]): [string, string[], NodeJS.ProcessEnv] {
  if (lang === 'ts') return [process.execPath, [join(repoRoot, 'dist/test/client/clientScript.js'), ...args], process.env];
  const env = {
    ...process.env,
    PYTHONDONTWRITEBYTECODE: '1',
    WEIGHTD_TEST_TENSOR_FORMAT: PYTHON_FORMAT[lang],
  };
  return [PYTHON, [join(repoRoot, 'test/client/client_script.py'), ...args], env];
}

export function spawnClient(lang: ClientLanguage, cmd: string, socket: string, expected: Expected, arg?: string, extraEnv: Record<string, string> = {}): ChildProcess {
  const [exe, args, env] = command(lang, [cmd, socket, JSON.stringify(expected), ...(arg === undefined ? [] : [arg])]);
  return spawn(exe, args, { env: { ...env, ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
}

/** Runs a client to completion; rejects with its stderr if it fails. */
export function runClient<T = Record<string, unknown>>(
  lang: ClientLanguage,
  cmd: string,
  socket: string,
  expected: Expected,
  arg?: string,
  extraEnv: Record<string, string> = {},
): Promise<T> {
  const child = spawnClient(lang, cmd, socket, expected, arg, extraEnv);
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  return new Promise((resolve, reject) => {
    // 'close', not 'exit': its last line may still be in the pipe when it exits.
    child.on('close', (code, signal) => {
      if (code !== 0) reject(new Error(`${lang} client ${cmd} exited ${signal ?? code}:\n${err}`));
      else {
        try {
          resolve(JSON.parse(out.trim().split('\n').pop()!) as T);
        } catch {
          reject(new Error(`${lang} client ${cmd} printed no JSON: ${out}\n${err}`));
        }
      }
    });
  });
}

/** Starts a client that prints one line and keeps running (hold); resolves with that line. */
export async function startHolder(lang: ClientLanguage, socket: string, expected: Expected): Promise<{ child: ChildProcess; line: { leaseId: string; pid: number } }> {
  const child = spawnClient(lang, 'hold', socket, expected);
  const [first] = await printedLines(child).wait(1, `the ${lang} holder attached`);
  return { child, line: JSON.parse(first!) as { leaseId: string; pid: number } };
}

/**
 * What `child` prints, line by line: `wait(n, what)` resolves once it has printed n lines and
 * rejects if it exits first. The child's exit is the only bound, with no clock: a loaded
 * machine may take any time to start Python, and a polling deadline failed there.
 */
export function printedLines(child: ChildProcess): { wait(n: number, what: string): Promise<string[]> } {
  let out = '';
  let err = '';
  let exited: number | string | null | undefined;
  const waiters = new Set<() => void>();
  const wake = () => waiters.forEach((w) => w());
  child.stdout!.on('data', (d: Buffer) => ((out += d.toString()), wake()));
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  // 'close', not 'exit': lines printed just before the exit may still be in the pipe.
  child.on('close', (code, signal) => ((exited = code ?? signal), wake()));
  return {
    wait: (n, what) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const lines = out.split('\n').slice(0, -1);
          if (lines.length >= n) return waiters.delete(check), resolve(lines);
          if (exited !== undefined) return waiters.delete(check), reject(new Error(`the client exited ${exited} before ${what}:\n${out}${err}`));
        };
        waiters.add(check);
        check();
      }),
  };
}

export function exitOf(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}
