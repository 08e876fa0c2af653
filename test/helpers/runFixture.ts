// Runs a fixture script in its own Node process, for behaviour that would hang or end the test
// process itself (a thread blocked for good, an exit). Resolves with how it ended and its stdout.
import { spawn } from 'node:child_process';

export interface FixtureEnd {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
}

/** `boundMs` only bounds a failure: a fixture that hangs is SIGKILLed and the test fails. */
export function runFixture(script: string, args: string[], boundMs = 60_000): Promise<FixtureEnd> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
    let stdout = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    const hang = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${script} did not end within ${boundMs / 1000} s (stdout: ${stdout})`));
    }, boundMs);
    child.on('error', reject);
    // 'close', not 'exit': what it printed last may still be in the pipe when it exits.
    child.on('close', (code, signal) => {
      clearTimeout(hang);
      resolve({ code, signal, stdout });
    });
  });
}
