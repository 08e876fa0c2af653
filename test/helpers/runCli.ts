import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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

/**
 * Runs `node dist/main.js ...args` to completion (killed after timeoutMs) and collects output.
 * Each run gets a TMPDIR of its own (unless opts.env names one), so a daemon started without
 * --weight-cache-socket-dir uses a default socket dir no other test shares: two test files
 * running at once both took the default dir's device lock, and one failed E_DEVICE_LOCKED.
 */
export function runCli(args: string[], opts: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Promise<CliResult> {
  const ownTmp = opts.env?.TMPDIR === undefined ? mkdtempSync(join(tmpdir(), 'weightd-cli-')) : undefined;
  return new Promise((resolve) => {
    const env = { ...process.env, ...(ownTmp ? { TMPDIR: ownTmp } : {}), ...opts.env };
    const child = spawn(process.execPath, [mainJs, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 20_000);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (ownTmp) rmSync(ownTmp, { recursive: true, force: true });
      resolve({ code, signal, stdout, stderr, messages: messagesOf(stderr) });
    });
  });
}
