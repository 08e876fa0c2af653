// The README's first command: the CLI starts on the example checkpoint, prints READY once
// after every log line, and exits 0 on SIGTERM/SIGINT leaving no segment behind.
import { spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { exampleModel, freshSocketDir, mainJs } from '../helpers/paths.js';

const leftSegments = (pid: number) => readdirSync('/dev/shm').filter((f) => f.startsWith(`weightd-${pid}-`));

async function runUntilReadyThenSignal(signal: NodeJS.Signals, extra: string[] = []) {
  const child = spawn(process.execPath, [mainJs, '--model', exampleModel, '--weight-cache-socket-dir', freshSocketDir(), ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let signalled = false;
  const closed = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  child.stderr.on('data', (d) => {
    stderr += d;
    if (!signalled && /READY/.test(stderr)) {
      signalled = true;
      // Let any late line arrive first: READY must already be after all of them.
      setTimeout(() => child.kill(signal), 300);
    }
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  const code = await closed;
  clearTimeout(timer);
  return { code, stderr, pid: child.pid! };
}

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  test(`starts on the example, READY once, ${signal} exits 0 and cleans up`, async () => {
    {
      const { code, stderr, pid } = await runUntilReadyThenSignal(signal, ['-tp', '2', '--device', 'host']);
      const lines = stderr.trim().split('\n');
      const readyLines = lines.filter((l) => l.includes('READY'));
      assert.is(readyLines.length, 1, 'READY printed once');
      assert.match(readyLines[0]!, /^READY node 0\/1 local_ranks=2 /);
      const readyAt = lines.indexOf(readyLines[0]!);
      const before = lines.slice(0, readyAt);
      assert.ok(before.some((l) => l.includes('checkpoint planned')), 'log lines came before READY');
      for (const l of lines.slice(readyAt + 1)) assert.ok(!/"msg":"(checkpoint planned|supervisor state)".*"state":"(loading|ready)"/.test(l), `no loading line after READY: ${l}`);
      assert.ok(lines.slice(readyAt + 1).some((l) => l.includes('"stopping"')), 'the stop is logged after READY');
      assert.is(code, 0, stderr);
      assert.equal(leftSegments(pid), [], 'no segment of that daemon is left');
    }
  });
}

test('every log line is JSON carrying the node rank (no TTY)', async () => {
  const { stderr, pid } = await runUntilReadyThenSignal('SIGTERM');
  for (const l of stderr.trim().split('\n').filter((l) => !l.startsWith('READY'))) {
    const rec = JSON.parse(l) as { nodeRank?: number };
    assert.is(rec.nodeRank, 0, l);
  }
  assert.equal(leftSegments(pid), [], 'no segment of that daemon is left');
});

test.run();
