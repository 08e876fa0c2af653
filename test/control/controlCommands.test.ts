// Adding a control command touches these files and no others (issue 32): its schema in
// src/control/controlProtocol.ts; its handler, src/control/handlers/<cmd>.ts, registered in
// src/control/handlers/index.ts; its `weightd ctl` entry (flags, request, printing),
// src/cli/ctl/<cmd>.ts, registered in src/cli/ctl/index.ts; and its row in docs/operations.md
// (Control socket). This test holds every command of the schema to exactly that set.
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CTL_COMMANDS } from '../../src/cli/ctl/index.js';
import { buildProgram } from '../../src/cli/parseArgs.js';
import { CONTROL_COMMANDS } from '../../src/control/controlProtocol.js';
import { CONTROL_HANDLERS } from '../../src/control/handlers/index.js';
import { repoRoot } from '../helpers/paths.js';

const HANDLERS_DIR = 'src/control/handlers';
const CTL_DIR = 'src/cli/ctl';
/** The files in those folders that are not a command's. */
const NOT_COMMANDS = new Set(['index.ts', 'ctlCommand.ts']);

const commandFiles = (dir: string) =>
  readdirSync(`${repoRoot}${dir}`)
    .filter((f) => f.endsWith('.ts') && !NOT_COMMANDS.has(f))
    .map((f) => f.slice(0, -'.ts'.length))
    .sort();
const sorted = (names: readonly string[]) => [...names].sort();

/** Each command of the schema has one file in `dir`, whose export of its name is what `table` registers; no other file is there. */
async function oneFileEach(dir: string, table: Record<string, unknown>): Promise<void> {
  assert.equal(commandFiles(dir), sorted(CONTROL_COMMANDS), `one file per command in ${dir}`);
  assert.equal(sorted(Object.keys(table)), sorted(CONTROL_COMMANDS), `${dir}/index.ts registers every command`);
  for (const cmd of CONTROL_COMMANDS) {
    const file = (await import(`../../${dir}/${cmd}.js`)) as Record<string, unknown>;
    assert.is(table[cmd], file[cmd], `${cmd}: what ${dir}/index.ts registers is the one in ${dir}/${cmd}.ts`);
  }
}

test('the control schema names the commands it had', () => {
  assert.equal(sorted(CONTROL_COMMANDS), ['list', 'load', 'rollback', 'unload']);
});

test('every control command has exactly one handler file, registered in the handler index, and no handler file lacks a command', async () => {
  await oneFileEach(HANDLERS_DIR, CONTROL_HANDLERS);
});

test('every control command has exactly one `weightd ctl` entry, registered in the ctl index and on the command line', async () => {
  await oneFileEach(CTL_DIR, CTL_COMMANDS);
  const ctl = buildProgram().commands.find((c) => c.name() === 'ctl')!;
  assert.equal(sorted(ctl.commands.map((c) => c.name())), sorted(CONTROL_COMMANDS), 'weightd ctl offers every command, and only those');
});

test('every control command has its row in docs/operations.md (Control socket)', () => {
  const doc = readFileSync(`${repoRoot}docs/operations.md`, 'utf8');
  const section = doc.slice(doc.indexOf('### Control socket'), doc.indexOf('\n### ', doc.indexOf('### Control socket') + 1));
  const rows = [...section.matchAll(/^\| `\{ "cmd": "([a-z_]+)"/gm)].map((m) => m[1]!);
  assert.equal(sorted(rows), sorted(CONTROL_COMMANDS));
});

test.run();
