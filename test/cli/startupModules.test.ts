// What a daemon loads to serve: nothing that serving does not use; and what the commands that
// only print or ask a daemon load: none of the daemon's libraries. Each process runs with a
// preload (fixtures/recordModules.ts) that records every module its threads load; the same
// record, with --inspect-port and a scrape, must then hold what was left out, so an empty or
// broken record cannot pass for a lean start.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { httpGet } from '../inspect/httpGet.js';
import { runCli } from '../helpers/runCli.js';

const recorder = new URL('./fixtures/recordModules.js', import.meta.url).href;

/** Left out of a start that asks for none of them, and where each is asked for. */
const ON_DEMAND = {
  'prom-client (metrics)': '/node_modules/prom-client/',
  'pino-pretty (readable log)': '/node_modules/pino-pretty/',
  'the inspect server': '/dist/src/inspect/inspectServer.js',
  'the statechart page': '/dist/src/inspect/statechartPage.js',
  'the chart drawing': '/dist/src/inspect/machineToMermaid.js',
  'the drawn machines (every machine, for the page)': '/dist/src/machines/drawnMachines.js',
  'the fingerprint command': '/dist/src/cli/printFingerprints.js',
  "a rank's keeper side": '/dist/src/actors/rankKeeping.js',
  "the keeper's record schema": '/dist/src/keeper/keptRecord.js',
  // The addon hashes a daemon's content sample: the package's native module is for the commands
  // and the header workers that hash one in JavaScript (src/checkpoint/sampleContent.ts).
  '@node-rs/xxhash (a content sample hashed in JavaScript)': '/node_modules/@node-rs/xxhash/',
};

/** Starts a daemon on the example, runs `whileReady`, stops it and returns every module path its threads loaded. */
async function modulesOfARun(extraArgs: string[], whileReady: (stderr: string) => Promise<void> = async () => {}): Promise<string[]> {
  const record = join(freshTempDir(), 'modules.txt');
  const daemon = await startDaemon({
    model: exampleModel,
    socketDir: freshSocketDir(),
    extraArgs,
    env: { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${recorder}`, WEIGHTD_TEST_MODULES: record },
  });
  await whileReady(daemon.stderr());
  const exit = await daemon.stop();
  assert.equal(exit, { code: 0, signal: null }, daemon.stderr().slice(-2000));
  return readFileSync(record, 'utf8').trim().split('\n').map((l) => l.slice(l.lastIndexOf(' ') + 1).replace(/^file:\/\//, ''));
}

const has = (modules: string[], part: string) => modules.some((m) => m.includes(part));

/** What the daemon needs and a command that only prints or asks one (--version, --help, ctl) does not. */
const DAEMON_ONLY = {
  'zod (schemas)': '/node_modules/zod/',
  'xstate (machines)': '/node_modules/xstate/',
  'pino (the logger)': '/node_modules/pino/',
  'the node': '/dist/src/startNode.js',
};

/** Runs `weightd ...args` to its end and returns its exit, output and every module it loaded. */
async function modulesOfACommand(args: string[]) {
  const record = join(freshTempDir(), 'modules.txt');
  const r = await runCli(args, { env: { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${recorder}`, WEIGHTD_TEST_MODULES: record } });
  const modules = readFileSync(record, 'utf8').trim().split('\n').map((l) => l.slice(l.lastIndexOf(' ') + 1).replace(/^file:\/\//, ''));
  return { ...r, modules };
}

test('a plain start loads none of the modules kept for when they are asked for', async () => {
  const modules = await modulesOfARun([]);
  // The record saw both threads and both kinds of module: the node (ES), the rank's worker, and
  // pino (CommonJS, read from require.cache at exit).
  for (const part of ['/dist/src/startNode.js', '/dist/src/actors/rankWorker.js', '/node_modules/pino/']) assert.ok(has(modules, part), `${part} recorded`);
  const loaded = Object.entries(ON_DEMAND).filter(([, part]) => has(modules, part)).map(([what]) => what);
  assert.equal(loaded, [], 'loaded although nothing asked for them');
});

test('--inspect-port loads the inspect server and its page; the first scrape loads prom-client', async () => {
  const modules = await modulesOfARun(['--inspect-port', '0'], async (stderr) => {
    const url = /"url":"(http:[^"]+)"/.exec(stderr)?.[1];
    assert.ok(url, `the inspect server's url is logged:\n${stderr}`);
    const metrics = await httpGet(`${url}/metrics`);
    assert.is(metrics.status, 200);
    assert.match(metrics.body, /^weightd_node_state\{state="ready"\} 1$/m);
  });
  for (const what of ['prom-client (metrics)', 'the inspect server', 'the statechart page', 'the chart drawing', 'the drawn machines (every machine, for the page)'] as const) assert.ok(has(modules, ON_DEMAND[what]), `${what} loaded`);
  assert.not.ok(has(modules, ON_DEMAND['pino-pretty (readable log)']), 'still no pino-pretty: the log is JSON');
});

test('--version, --help and ctl list load neither zod, xstate, pino nor the node', async () => {
  const version = await modulesOfACommand(['--version']);
  assert.is(version.code, 0, version.stderr);
  assert.match(version.stdout, /^\d+\.\d+\.\d+/);
  const help = await modulesOfACommand(['--help']);
  assert.is(help.code, 0, help.stderr);
  assert.match(help.stdout, /--model <dir>/);

  const socketDir = freshSocketDir();
  const daemon = await startDaemon({ model: exampleModel, socketDir });
  let list;
  try {
    list = await modulesOfACommand(['ctl', 'list', '--weight-cache-socket-dir', socketDir]);
  } finally {
    await daemon.stop();
  }
  assert.is(list.code, 0, list.stderr);
  assert.match(list.stdout, /^tiny-llama \(own\) {2}v0 {2}serving /m);

  for (const [what, run] of Object.entries({ '--version': version, '--help': help, 'ctl list': list })) {
    // The record saw the entry itself, so an empty record cannot pass for a light one.
    assert.ok(has(run.modules, '/dist/src/main.js'), `${what}: the entry recorded`);
    const loaded = Object.entries(DAEMON_ONLY).filter(([, part]) => has(run.modules, part)).map(([name]) => name);
    assert.equal(loaded, [], `${what} loaded what only the daemon needs`);
  }
  assert.ok(has(list.modules, '/dist/src/cli/runCtl.js'), 'ctl list recorded its own module');
  for (const [what, run] of Object.entries({ '--help': help, 'ctl list': list })) {
    assert.ok(has(run.modules, '/dist/src/cli/parseArgs.js') && has(run.modules, '/node_modules/commander/'), `${what}: the command line parsed`);
  }
  // The version is one line: printed before the command line's parser (commander) loads.
  const parser = ['/dist/src/cli/parseArgs.js', '/node_modules/commander/'].filter((part) => has(version.modules, part));
  assert.equal(parser, [], '--version loaded the command line parser');
  assert.ok(has(version.modules, '/dist/src/version.js'), '--version recorded the module it prints from');
});

test('pino-pretty loads with the first logger that writes the readable form', async () => {
  const { createLogger } = await import('../../src/createLogger.js');
  const { cache } = createRequire(import.meta.url);
  const loaded = () => Object.keys(cache).some((f) => f.includes(ON_DEMAND['pino-pretty (readable log)']));
  createLogger({ nodeRank: 0, pretty: false });
  assert.not.ok(loaded(), 'not for JSON');
  createLogger({ nodeRank: 0, pretty: true, level: 'silent' });
  assert.ok(loaded(), 'for the readable form');
});

test.run();
