import { spawn } from 'node:child_process';
import { mainJs } from './paths.js';

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** stderr with each JSON log line replaced by its msg, for matching messages. */
  messages: string;
}

function messagesOf(stderr: string): string {
  return stderr
    .split('\n')
    .map((l) => {
      try {
        return (JSON.parse(l) as { msg?: string }).msg ?? l;
      } catch {
        return l;
      }
    })
    .join('\n');
}

/** Runs `node dist/main.js ...args` to completion (killed after timeoutMs) and collects output. */
export function runCli(args: string[], opts: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [mainJs, ...args], { env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 20_000);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, messages: messagesOf(stderr) });
    });
  });
}
