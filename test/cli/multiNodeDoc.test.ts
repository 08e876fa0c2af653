// docs/multi-node.md's one-machine example works as written: its two commands, taken from the
// doc, form a group over loopback and both nodes report group ready. Only the port and the
// socket dirs are swapped for fresh ones, so parallel test files never collide on them.
import { readFileSync, rmSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freePort } from '../../src/nodeOptions.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { freshSocketDir, repoRoot } from '../helpers/paths.js';

interface DocCommand {
  env: Record<string, string>;
  args: string[];
}

/** The sh block under "The same example on one machine": one command per `# node N` comment. */
function docCommands(): DocCommand[] {
  const doc = readFileSync(`${repoRoot}docs/multi-node.md`, 'utf8');
  const section = doc.slice(doc.indexOf('### The same example on one machine'));
  const block = /```sh\n([\s\S]*?)```/.exec(section)![1]!;
  return block
    .replace(/\\\n\s*/g, ' ')
    .split('\n')
    .filter((l) => l.trim() !== '' && !l.startsWith('#'))
    .map((l) => {
      const words = l.trim().split(/\s+/);
      const env: Record<string, string> = {};
      while (/^[A-Z_]+=/.test(words[0]!)) {
        const [k, v] = words.shift()!.split('=') as [string, string];
        env[k] = v;
      }
      assert.equal(words.slice(0, 2), ['node', 'dist/main.js'], l);
      return { env, args: words.slice(2) };
    });
}

const flag = (args: string[], name: string) => args[args.indexOf(name) + 1]!;

test('the one-machine example of docs/multi-node.md forms a group over loopback', async () => {
  const commands = docCommands();
  assert.is(commands.length, 2);
  const port = String(await freePort());
  const dirs = commands.map(() => freshSocketDir());
  const daemons: Daemon[] = [];
  try {
    const starting = commands.map(({ env, args }, i) => {
      const a = args.map((w, j) => (args[j - 1] === '--weight-cache-master-port' ? port : args[j - 1] === '--weight-cache-socket-dir' ? dirs[i]! : w));
      const model = flag(a, '--model');
      // startDaemon adds --model, -tp and --device itself: pass the doc's values through it.
      const rest = a.filter((_, j) => !['--model', '--tensor-parallel-size', '--device'].includes(a[j]!) && !['--model', '--tensor-parallel-size', '--device'].includes(a[j - 1]!));
      return startDaemon({ model: `${repoRoot}${model}`, tp: Number(flag(a, '--tensor-parallel-size')), device: flag(a, '--device') as 'host', devices: env.WEIGHTD_HOST_DEVICES!.split(','), extraArgs: rest });
    });
    daemons.push(...(await Promise.all(starting)));
    await Promise.all(daemons.map((d) => d.waitFor(/group ready: every node is serving/)));
    for (const d of daemons) assert.equal(await d.stop(), { code: 0, signal: null }, d.stderr());
  } finally {
    await Promise.all(daemons.map((d) => d.stop()));
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
