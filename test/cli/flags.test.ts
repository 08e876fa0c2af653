// Every bad flag exits with code 2 before anything starts, naming the flag, the value and a fix.
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseArgs } from '../../src/cli/parseArgs.js';
import { exampleModel, repoRoot } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

const emptyDir = mkdtempSync(join(tmpdir(), 'weightd-empty-'));
const aFile = join(emptyDir, 'not-a-dir.txt');
writeFileSync(aFile, 'x');

const m = ['--model', exampleModel];
const cases: Array<[string, string[], RegExp]> = [
  ['tp 0', [...m, '--tensor-parallel-size', '0'], /--tensor-parallel-size 0: must be an integer from 1/],
  ['tp not a number', [...m, '-tp', 'two'], /--tensor-parallel-size "two": must be an integer/],
  ['tp fractional', [...m, '-tp', '1.5'], /--tensor-parallel-size 1\.5: must be an integer/],
  ['nnodes 0', [...m, '--nnodes', '0'], /--nnodes 0: must be an integer from 1/],
  ['nnodes does not divide tp', [...m, '-tp', '3', '--nnodes', '2', '--weight-cache-master-port', '29600'], /--nnodes 2: does not divide --tensor-parallel-size 3/],
  ['node rank negative', [...m, '--node-rank', '-1'], /--node-rank -1: must be an integer from 0 to 0/],
  ['node rank too big', [...m, '-tp', '2', '--nnodes', '2', '--node-rank', '2', '--weight-cache-master-port', '29600'], /--node-rank 2: must be an integer from 0 to 1/],
  ['port 0', [...m, '--weight-cache-master-port', '0'], /--weight-cache-master-port 0: must be an integer from 1 to 65535/],
  ['port too big', [...m, '--weight-cache-master-port', '70000'], /--weight-cache-master-port 70000: must be an integer from 1 to 65535/],
  ['master port not a number', [...m, '--master-port', 'http'], /--master-port "http": must be an integer from 1 to 65535/],
  ['same ports', [...m, '--master-port', '29500', '--weight-cache-master-port', '29500'], /--weight-cache-master-port 29500: equals --master-port/],
  ['multi-node without our port', [...m, '-tp', '2', '--nnodes', '2'], /^--weight-cache-master-port is required when --nnodes > 1; pass the same free port/],
  ['inspect host without port', [...m, '--inspect-host', '127.0.0.1'], /^--inspect-port is required with --inspect-host/],
  ['rendezvous timeout negative, in seconds', [...m, '--rendezvous-timeout', '-1'], /^--rendezvous-timeout -1: must be a number of seconds from 0\.001 to 86400/],
  ['rendezvous timeout not a number', [...m, '--rendezvous-timeout', 'soon'], /^--rendezvous-timeout "soon": must be a number of seconds/],
  ['--tp, as other tools spell it', [...m, '--tp', '2'], /unknown option '--tp' \(Did you mean --tensor-parallel-size or -tp\?\)/],
  ['--tensor-parallel, as other tools spell it', [...m, '--tensor-parallel', '2'], /unknown option '--tensor-parallel' \(Did you mean --tensor-parallel-size or -tp\?\)/],
  ["commander's suggestion, on the same line", ['--modle', exampleModel], /^unknown option '--modle' \(Did you mean --model\?\); run weightd --help/],
  ['a positional model dir', [exampleModel], /^".*tiny-llama": weightd takes the checkpoint directory as --model .*tiny-llama, not as an argument/],
  ['a stray argument after --model', [...m, 'extra'], /^"extra": weightd takes no arguments besides its flags/],
  ["a tp size the model's heads do not divide (found after parsing)", [...m, '-tp', '3', '--device', 'host'], /num_attention_heads 8 is not divisible by tp size 3/],
  ['no model', [], /^weightd needs a checkpoint to serve: weightd --model DIR/],
  ['model missing', ['--model', '/nonexistent/model'], /--model "\/nonexistent\/model": cannot be read \(ENOENT\)/],
  ['model is a file', ['--model', aFile], /is not a directory/],
  ['model without safetensors', ['--model', emptyDir], /holds no \.safetensors file/],
  ['unknown device', [...m, '--device', 'tpu'], /option '--device <backend>' argument 'tpu' is invalid/],
  ['unknown log level', [...m, '--log-level', 'loud'], /argument 'loud' is invalid/],
  ['unknown direct-io mode', [...m, '--direct-io', 'maybe'], /option '--direct-io <mode>' argument 'maybe' is invalid\. Allowed choices are auto, on, off/],
  ['unknown cuda-handles kind', [...m, '--cuda-handles', 'posix'], /option '--cuda-handles <kind>' argument 'posix' is invalid\. Allowed choices are ipc, fd/],
  ['unknown flag', [...m, '--bogus'], /unknown option '--bogus'/],
  ['unknown keeper mode', [...m, '--keeper', 'always'], /option '--keeper <mode>' argument 'always' is invalid\. Allowed choices are off, spawn, external/],
  ['keeper socket without a keeper', [...m, '--keeper-socket', '/run/k.sock'], /^--keeper-socket "\/run\/k\.sock": has no effect with --keeper off; pass --keeper spawn or --keeper external too/],
  ['adopt-within 0', [...m, '--keeper', 'spawn', '--adopt-within', '0'], /^--adopt-within 0: must be an integer from 1 to 2592000/],
  ['unknown eviction policy', [...m, '--evict', 'lru'], /option '--evict <policy>' argument 'lru' is invalid\. Allowed choices are off, no-lease-lru/],
  ['verify --version not a number', ['verify', '--name', 'm', '--version', 'abc'], /^--version "abc": must be an integer from 0 to \d+; pass a version number as weightd ctl list shows it/],
  ['verify --version negative', ['verify', '--name', 'm', '--version', '-1'], /^--version "-1": must be an integer from 0/],
  ['verify --version fractional', ['verify', '--name', 'm', '--version', '1.5'], /^--version "1\.5": must be an integer from 0/],
  ['verify --global-rank not a number, with --name', ['verify', '--name', 'm', '--version', 'v1', '--global-rank', 'x'], /^--global-rank "x": must be an integer from 0/],
  ['verify --global-rank negative, with --model', ['verify', ...m, '--global-rank', '-1'], /^--global-rank "-1": must be an integer from 0/],
  ['adopt-within with an external keeper', [...m, '--keeper', 'external', '--adopt-within', '60'], /^--adopt-within 60: applies only to a keeper this daemon spawns; set it on the keeper's own command line/],
];

for (const [name, args, message] of cases) {
  test(`bad flag: ${name}`, async () => {
    const r = await runCli(args);
    assert.is(r.code, 2, `exit code 2, got ${r.code}: ${r.stderr}`);
    assert.match(r.messages, message);
    assert.ok(!r.messages.includes('undefined'), `no "undefined" in: ${r.messages}`);
    if (!/tp size 3/.test(message.source)) assert.is(r.stderr.trim().split('\n').length, 1, `one line: ${r.stderr}`);
    assert.not.match(r.stderr, /READY/);
  });
}

test('copy engine flags reach the fill options; --direct-io auto leaves the choice to the daemon', () => {
  assert.equal(parseArgs([...m, '--staging-mb', '64', '--load-threads', '12', '--direct-io', 'on']).fill, { stagingBytes: 64 * 2 ** 20, threads: 12, direct: true });
  assert.equal(parseArgs([...m, '--direct-io', 'off']).fill, { direct: false });
  assert.equal(parseArgs([...m, '--direct-io', 'auto']).fill, {});
  assert.equal(parseArgs(m).fill, {});
});

test('keeper flags reach the options', () => {
  assert.equal(parseArgs(m).keeper, { mode: 'off', socket: undefined, adoptWithinS: undefined });
  assert.equal(parseArgs([...m, '--keeper', 'spawn', '--adopt-within', '30']).keeper, { mode: 'spawn', socket: undefined, adoptWithinS: 30 });
  assert.equal(parseArgs([...m, '--keeper', 'external', '--keeper-socket', '/run/weightd-keeper/keeper.sock']).keeper, { mode: 'external', socket: '/run/weightd-keeper/keeper.sock', adoptWithinS: undefined });
});

test('--evict reaches the options (default off), and ctl load --evict its request (default: none, the daemon decides)', async () => {
  assert.is(parseArgs(m).evict, 'off');
  assert.is(parseArgs([...m, '--evict', 'no-lease-lru']).evict, 'no-lease-lru');
  const { parseCommand } = await import('../../src/cli/parseArgs.js');
  const load = (extra: string[]) => parseCommand(['ctl', 'load', '--model', exampleModel, ...extra]);
  assert.is((load([]) as { request: { evict?: string } }).request.evict, undefined);
  assert.is((load(['--evict', 'off']) as { request: { evict?: string } }).request.evict, 'off');
  const { resolveNodeOptions } = await import('../../src/nodeOptions.js');
  await resolveNodeOptions({ model: exampleModel, evict: 'lru' as never }).then(
    () => assert.unreachable('an unknown policy must be refused'),
    (e: Error) => assert.match(e.message, /^--evict "lru": is not an eviction policy; use off or no-lease-lru/),
  );
});

test('--cuda-handles reaches the options: fd by default with a keeper, ipc without; the API refuses another kind naming the flag', async () => {
  assert.is(parseArgs(m).cudaHandles, undefined);
  assert.is(parseArgs([...m, '--cuda-handles', 'fd']).cudaHandles, 'fd');
  const { resolveNodeOptions } = await import('../../src/nodeOptions.js');
  assert.is((await resolveNodeOptions({ model: exampleModel })).cudaHandles, 'ipc');
  assert.is((await resolveNodeOptions({ model: exampleModel, keeper: { mode: 'spawn' } })).cudaHandles, 'fd');
  assert.is((await resolveNodeOptions({ model: exampleModel, keeper: { mode: 'external' } })).cudaHandles, 'fd');
  assert.is((await resolveNodeOptions({ model: exampleModel, keeper: { mode: 'spawn' }, cudaHandles: 'ipc' })).cudaHandles, 'ipc');
  const err = await resolveNodeOptions({ model: exampleModel, cudaHandles: 'posix' as 'fd' }).then(() => undefined, (e: Error) => e);
  assert.match(err?.message ?? '', /^--cuda-handles "posix": is not a kind of CUDA handle; use ipc or fd \(default: fd with a keeper, else ipc\)/);
});

test('--device cuda without a driver exits 2 like a bad flag', async () => {
  const { cudaProbe } = await import('../../src/native/cuda.js');
  const probe = await cudaProbe();
  if (probe.available) return console.log('  (skipped: this machine has a CUDA driver and GPU)');
  const r = await runCli([...m, '--device', 'cuda']);
  assert.is(r.code, 2, r.stderr);
  assert.match(r.messages, /--device cuda: /);
});

test('--help lists examples, exit codes and every environment variable the daemon reads', async () => {
  const help = await runCli(['--help']);
  assert.is(help.code, 0);
  assert.match(help.stdout, /Examples:\n {2}weightd --model/);
  assert.match(help.stdout, /Exit codes:\n {2}0 .*\n {2}1 .*\n {2}2 /);
  const names = new Set<string>();
  const walk = (dir: string) => {
    for (const f of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, f.name);
      if (f.isDirectory()) walk(p);
      else if (f.name.endsWith('.ts')) for (const [n] of readFileSync(p, 'utf8').matchAll(/\bWEIGHTD_[A-Z_]+[A-Z]\b/g)) names.add(n);
    }
  };
  walk(join(repoRoot, 'src'));
  assert.ok(names.has('WEIGHTD_TOKEN') && names.has('WEIGHTD_HOST_DEVICES'), [...names].join(' '));
  for (const n of names) if (!n.endsWith('_')) assert.ok(help.stdout.includes(n), `--help names ${n}`);
});

test('--help and --version exit 0', async () => {
  const help = await runCli(['--help']);
  assert.is(help.code, 0);
  for (const flag of ['--model', '--tensor-parallel-size', '--nnodes', '--node-rank', '--master-addr', '--master-port', '--weight-cache-master-port', '--weight-cache-socket-dir', '--device', '--log-level']) {
    assert.ok(help.stdout.includes(flag), `help lists ${flag}`);
  }
  const version = await runCli(['--version']);
  assert.is(version.code, 0);
  assert.match(version.stdout, /^\d+\.\d+\.\d+/);
});

test.after(() => rmSync(emptyDir, { recursive: true, force: true }));
test.run();
