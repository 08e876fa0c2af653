// The README's commands, run as written, in the checkout, as a newcomer runs them after the
// quick start's `npm install`: the quick start's daemon, and every line of "The `weightd`
// command" block (a line ending in `&` is the daemon those after it talk to; `kill %1` stops it).
// Each run gets a TMPDIR of its own, so the default socket directory is this test's alone.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { READY_LINE } from '../helpers/daemon.js';
import { repoRoot } from '../helpers/paths.js';

const readme = readFileSync(join(repoRoot, 'README.md'), 'utf8');

/** The shell lines of the first ```sh block after `heading`, comments dropped. */
function shellLines(heading: string): string[] {
  const from = readme.indexOf(heading);
  assert.ok(from >= 0, `README has ${heading}`);
  const block = /```sh\n([\s\S]*?)```/.exec(readme.slice(from))![1]!;
  return block
    .split('\n')
    .map((l) => l.replace(/\s+#.*$/, '').trim())
    .filter(Boolean);
}

interface Background {
  child: ChildProcess;
  stderr: () => string;
  exit: Promise<number | null>;
}

/** Runs `line` with sh in a process group of its own (as a shell runs a job), TMPDIR private. */
function background(line: string, env: NodeJS.ProcessEnv): Background {
  // exec: the job is the command itself, as in an interactive shell, whose own process is not in it.
  const child = spawn('sh', ['-c', `exec ${line}`], { cwd: repoRoot, env, detached: true, stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const exit = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
  return { child, stderr: () => err, exit };
}

async function untilReady(job: Background): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const check = () => (READY_LINE.test(job.stderr()) ? (job.child.stderr!.off('data', check), resolve()) : undefined);
    job.child.stderr!.on('data', check);
    void job.exit.then(() => reject(new Error(`exited before READY:\n${job.stderr().slice(-2000)}`)));
    check();
  });
}

function withTmp<T>(run: (env: NodeJS.ProcessEnv) => Promise<T>): Promise<T> {
  const tmp = mkdtempSync(join(tmpdir(), 'weightd-readme-'));
  const env = { ...process.env, TMPDIR: tmp, WEIGHTD_HOST_DEVICES: `readme-${process.pid}` };
  return run(env).finally(() => rmSync(tmp, { recursive: true, force: true }));
}

test("the quick start's first command serves the example and stops cleanly on Ctrl-C", () =>
  withTmp(async (env) => {
    const [first] = shellLines('## Quick start');
    assert.match(first!, /^npm install && /);
    // npm install is what the checkout under test already did.
    const job = background(first!.replace(/^npm install && /, ''), env);
    try {
      await untilReady(job);
      process.kill(-job.child.pid!, 'SIGINT');
      assert.is(await job.exit, 0, job.stderr().slice(-2000));
    } finally {
      job.child.kill('SIGKILL');
    }
  }),
);

test('every line of "The `weightd` command" block runs as written', () =>
  withTmp(async (env) => {
    const lines = shellLines('### The `weightd` command');
    assert.ok(lines.length >= 5, lines.join('\n'));
    let daemon: Background | undefined;
    try {
      for (const line of lines) {
        if (line.endsWith('&')) {
          daemon = background(line.slice(0, -1), env);
          await untilReady(daemon);
        } else if (line === 'kill %1') {
          assert.ok(daemon, 'a job to kill');
          process.kill(-daemon!.child.pid!, 'SIGTERM');
          assert.is(await daemon!.exit, 0, daemon!.stderr().slice(-2000));
          daemon = undefined;
        } else {
          assert.match(line, /^\.\/weightd /);
          const r = spawnSync('sh', ['-c', line], { cwd: repoRoot, env, encoding: 'utf8', timeout: 60_000 });
          assert.is(r.status, 0, `${line}: ${r.stderr}`);
          assert.ok(r.stdout.trim().length > 0, `${line} printed something`);
        }
      }
      assert.is(daemon, undefined, 'the block stops what it started');
    } finally {
      if (daemon) process.kill(-daemon.child.pid!, 'SIGKILL');
    }
  }),
);

test.run();
