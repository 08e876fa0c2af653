// The command line is one: a subcommand takes the daemon's shared flags wherever the user types
// them, a flag given where it does not belong is named as belonging elsewhere (never "unknown"),
// and every subcommand's help shows an example with the socket directory.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildProgram, NO_MODEL_USAGE, parseCommand } from '../../src/cli/parseArgs.js';
import { UsageError } from '../../src/errors.js';
import { exampleModel } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

const S = '/run/weightd-test-sockets';
const dirFlag = ['--weight-cache-socket-dir', S];
const leaves: Array<[string[], string[]]> = [
  [['ctl', 'load'], ['--model', exampleModel]],
  [['ctl', 'unload'], ['draft']],
  [['ctl', 'list'], []],
  [['keeper', 'status'], []],
  [['keeper', 'stop'], []],
];

/** Where `parseCommand` says the command will look: the control socket's dir, or the keeper's socket. */
function target(argv: string[]): string | undefined {
  const c = parseCommand(argv);
  if (c.command === 'ctl') return c.socketDir;
  if (c.command === 'keeperAsk') return c.socket;
  throw new Error(`not a ctl or keeper command: ${c.command}`);
}

for (const [path, rest] of leaves) {
  test(`weightd ${path.join(' ')} takes --weight-cache-socket-dir before, inside and after the subcommand`, () => {
    const expected = path[0] === 'ctl' ? S : `${S}/keeper.sock`;
    assert.is(target([...dirFlag, ...path, ...rest]), expected, 'before');
    assert.is(target([path[0]!, ...dirFlag, ...path.slice(1), ...rest]), expected, 'between');
    assert.is(target([...path, ...rest, ...dirFlag]), expected, 'after');
    assert.is(target([...path, ...dirFlag, ...rest]), expected, 'among its own');
  });
}

test('a flag of another command is named as such, never as unknown, from every command', () => {
  const program = buildProgram();
  const all = (c: typeof program): Array<typeof program> => [c, ...c.commands.flatMap(all)];
  const commands = all(program);
  const flags = [...new Set(commands.flatMap((c) => c.options.map((o) => o.long!)))];
  let checked = 0;
  for (const c of commands) {
    const path: string[] = [];
    for (let p: typeof c | null = c; p?.parent; p = p.parent) path.unshift(p.name());
    // What the command needs besides, so that the flag is the only thing wrong.
    const rest = leaves.find(([p]) => p.join(' ') === path.join(' '))?.[1] ?? (path.length === 0 ? ['--model', exampleModel] : []);
    for (const flag of flags.filter((f) => !c.options.some((o) => o.long === f))) {
      assert.throws(
        () => parseCommand([...path, ...rest, flag, 'x']),
        (e: UsageError) => e instanceof UsageError && !/unknown option/.test(e.message) && e.message.includes(`${flag} is not a flag of weightd${path.map((p) => ` ${p}`).join('')}: it is one of `),
        `${path.join(' ')} ${flag}`,
      );
      checked++;
    }
  }
  assert.ok(checked > 50, `${checked} pairs`);
  assert.throws(() => parseCommand(['ctl', 'list', '--bogus']), /unknown option '--bogus'; run weightd ctl list --help/);
});

test("a daemon flag before a subcommand that does not take it is refused, not ignored", () => {
  assert.throws(() => parseCommand(['--model', exampleModel, 'ctl', 'list']), /--model is a flag of weightd, not of weightd ctl list; run weightd ctl list --help/);
  assert.throws(() => parseCommand(['keeper', '--adopt-within', '5', 'status']), /--adopt-within is a flag of weightd keeper, not of weightd keeper status/);
  assert.throws(() => parseCommand([...dirFlag, 'statechart']), /--weight-cache-socket-dir is a flag of weightd, not of weightd statechart/);
  assert.throws(() => parseCommand(['--device', 'host', 'fingerprint', '--model', exampleModel]), /--device is a flag of weightd, not of weightd fingerprint/);
  assert.throws(() => parseCommand(['--model', exampleModel, 'keeper']), /--model is a flag of weightd, not of weightd keeper/);
  // The shared flag before `keeper` places the keeper's socket in that directory.
  const run = parseCommand([...dirFlag, 'keeper']);
  assert.equal(run.command === 'keeper' && run.args.slice(0, 2), ['--socket', `${S}/keeper.sock`]);
});

test("every subcommand's --help shows an example with the socket directory", () => {
  for (const path of [['ctl'], ['ctl', 'load'], ['ctl', 'unload'], ['ctl', 'list'], ['keeper'], ['keeper', 'status'], ['keeper', 'stop']]) {
    const help = parseCommand([...path, '--help']);
    assert.is(help.command, 'print');
    if (help.command !== 'print') continue;
    const example = /\nExamples?:\n((?: {2}.*\n)+)/.exec(help.text)?.[1] ?? '';
    assert.match(example, new RegExp(`^ {2}weightd ${path.join(' ')} .*--(weight-cache-socket-dir|socket) /run/`, 'm'), `${path.join(' ')}:\n${help.text}`);
    // The example parses as the command it illustrates.
    const line = example.split('\n').find((l) => l.startsWith(`  weightd ${path.join(' ')}`))!.trim().split(/\s+/).slice(1);
    if (path.length === 2) assert.ok(['ctl', 'keeperAsk'].includes(parseCommand(line).command), line.join(' '));
  }
});

test('weightd with no arguments shows the usage and an example, exit 2', async () => {
  const r = await runCli([]);
  assert.is(r.code, 2);
  assert.is(r.messages.trim(), NO_MODEL_USAGE);
  assert.match(NO_MODEL_USAGE, /for example: weightd --model examples\/tiny-llama/);
});

test.run();
