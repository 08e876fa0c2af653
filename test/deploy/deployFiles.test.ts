// deploy/ as far as a machine without systemd as PID 1 or a cluster allows: systemd itself
// checks the units (systemd-analyze verify) against the documented install layout, made here by
// the bundle script itself (docs/operations.md, "Install"); their command lines are the ones
// weightd and its keeper accept; docs/operations.md shows them as shipped; the manifests pass
// the Kubernetes API's schema (kubernetes-models: types, required fields and enums; it does not
// refuse unknown fields), and the DaemonSet wires the keeper to the daemon (the same socket, the
// same uid, private directories, no GPU).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { Pod } from 'kubernetes-models/v1/Pod';
import { parse } from 'yaml';
import { parseCommand } from '../../src/cli/parseArgs.js';
import { KeeperClient, keeperBinaryPath } from '../../src/keeper/keeperClient.js';
import { repoRoot } from '../helpers/paths.js';

const units = ['weightd-keeper.service', 'weightd.service'];
const unitText = (name: string) => readFileSync(join(repoRoot, 'deploy/systemd', name), 'utf8');

/** The ExecStart= command line of a unit, continuation lines joined, split on blanks. */
function execStart(text: string): string[] {
  const joined = text.replace(/\\\n\s*/g, ' ');
  const line = /^ExecStart=(.*)$/m.exec(joined)![1]!;
  return line.trim().split(/\s+/);
}

/** The install layout, made as docs/operations.md says (the bundle's tree), under a temporary root. */
const installRoot = mkdtempSync(join(tmpdir(), 'weightd-install-'));
const installed = join(installRoot, 'opt/weightd');
process.on('exit', () => rmSync(installRoot, { recursive: true, force: true }));
const bundle = spawnSync('bash', [join(repoRoot, 'scripts/bundle.sh'), '--dir', installed], { encoding: 'utf8' });

/** A unit as installed under the temporary root: /opt/weightd is the laid-out bundle. */
function localUnit(text: string): string {
  return text.replaceAll('/opt/weightd/', `${installed}/`);
}

test('the install layout runs: bin/weightd and the keeper binary, from the bundle laid out by its script', () => {
  assert.is(bundle.status, 0, bundle.stderr);
  // A certificate file Node would read at its start, and warn about, were it given the variable.
  const env = { ...process.env, WEIGHTD_CODE_CACHE_DEBUG: '1', NODE_EXTRA_CA_CERTS: join(installRoot, 'no-such-ca.pem') };
  const version = spawnSync(join(installed, 'bin/weightd'), ['--version'], { encoding: 'utf8', env });
  assert.is(version.status, 0, version.stderr);
  assert.not.match(version.stderr, /extra certs/, 'bin/weightd starts Node without NODE_EXTRA_CA_CERTS');
  assert.match(version.stderr, /: code cache \S+: used$/m, 'the bundle holds the code cache made for its node, and bin/weightd uses it');
  assert.is(version.stdout.trim(), (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version);
  assert.is(readFileSync(join(installed, 'bin/node-flags'), 'utf8'), readFileSync(join(repoRoot, 'scripts/node-flags'), 'utf8'), "bin/weightd gives node the checkout's flags");
  for (const u of units) {
    const program = execStart(unitText(u))[0]!;
    assert.ok(program.startsWith('/opt/weightd/'), `${u} runs ${program} from the install layout`);
    assert.ok(existsSync(localUnit(program)), `${program} is in the bundle`);
  }
});

test('systemd accepts both units as written (no unknown key, every command executable)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-units-'));
  try {
    for (const u of units) writeFileSync(join(dir, u), localUnit(unitText(u)));
    const r = spawnSync('systemd-analyze', ['verify', ...units.map((u) => join(dir, u))], { encoding: 'utf8' });
    assert.ok(!r.error, `systemd-analyze runs (.ci/run installs systemd): ${r.error?.message}`);
    assert.is(r.status, 0, r.stderr);
    assert.is(r.stderr.trim(), '', 'no warning either');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the keeper's unit is sandboxed: systemd rates its exposure SAFE", () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-units-'));
  try {
    writeFileSync(join(dir, units[0]!), localUnit(unitText(units[0]!)));
    const r = spawnSync('systemd-analyze', ['security', '--offline=yes', join(dir, units[0]!)], { encoding: 'utf8' });
    const level = Number(/Overall exposure level for \S+: ([\d.]+)/.exec(r.stdout + r.stderr)?.[1]);
    assert.ok(level <= 1.5, `exposure ${level}:\n${r.stdout}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the daemon's unit keeps its shards in the keeper unit's socket, outside its own RuntimeDirectory", () => {
  const keeper = execStart(unitText('weightd-keeper.service'));
  const daemon = execStart(unitText('weightd.service'));
  const keeperSocket = keeper[keeper.indexOf('--socket') + 1]!;
  const cli = parseCommand(daemon.slice(1));
  assert.is(cli.command, 'run');
  if (cli.command !== 'run') return;
  assert.equal(cli.options.keeper, { mode: 'external', socket: keeperSocket, adoptWithinS: undefined });
  assert.ok(keeperSocket.startsWith('/run/weightd-keeper/'), keeperSocket);
  assert.match(unitText('weightd-keeper.service'), /^RuntimeDirectory=weightd-keeper$/m);
  assert.match(unitText('weightd.service'), /^Wants=.*weightd-keeper\.service/m);
  assert.not.match(unitText('weightd.service'), /BindsTo=|PartOf=/, 'restarting the daemon must not restart the keeper');
});

test("the keeper runs with the unit's own flags, answers, and ends cleanly on SIGTERM", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-unit-'));
  const args = execStart(unitText('weightd-keeper.service')).slice(1);
  const socket = join(dir, 'keeper.sock');
  args[args.indexOf('--socket') + 1] = socket;
  const child = spawn(keeperBinaryPath, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  try {
    const client = new KeeperClient(socket);
    const end = Date.now() + 20_000;
    let pid: number | undefined;
    while (pid === undefined && Date.now() < end) pid = await client.ping().then((p) => p.pid, () => new Promise<undefined>((r) => setTimeout(() => r(undefined), 20)));
    assert.is(pid, child.pid);
    const exit = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    child.kill('SIGTERM');
    assert.is(await exit, 0);
  } finally {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test('docs/operations.md shows the shipped units and DaemonSet as they are', () => {
  const doc = readFileSync(join(repoRoot, 'docs/operations.md'), 'utf8');
  const shown = new Map([...doc.matchAll(/^`(deploy\/[\w/.-]+)`[^\n]*:\n\n```(?:ini|yaml)\n([\s\S]*?)```$/gm)].map((m) => [m[1]!, m[2]!]));
  for (const file of [...units.map((u) => `deploy/systemd/${u}`), 'deploy/kubernetes/weightd-daemonset.yaml']) {
    assert.ok(shown.has(file), `the page shows ${file}`);
    assert.fixture(shown.get(file)!, readFileSync(join(repoRoot, file), 'utf8'));
  }
});

test("every whole manifest, shipped or in docs/operations.md, passes the Kubernetes API's schema", () => {
  const doc = readFileSync(join(repoRoot, 'docs/operations.md'), 'utf8');
  const manifests = [readFileSync(join(repoRoot, 'deploy/kubernetes/weightd-daemonset.yaml'), 'utf8'), ...[...doc.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]!).filter((y) => /^apiVersion:/m.test(y))];
  const kinds: string[] = [];
  for (const text of manifests) {
    const object = parse(text) as { kind: string };
    kinds.push(object.kind);
    const model = object.kind === 'DaemonSet' ? new DaemonSet(object as never) : object.kind === 'Pod' ? new Pod(object as never) : undefined;
    assert.ok(model, `a schema for ${object.kind}`);
    assert.not.throws(() => model!.validate(), `${object.kind}: ${(() => { try { model!.validate(); return ''; } catch (e) { return (e as Error).message; } })()}`);
  }
  assert.equal(kinds.sort(), ['DaemonSet', 'DaemonSet', 'Pod']);
  // The schema check can fail: a wrong type is refused.
  const broken = parse(manifests[0]!) as { spec: { template: { spec: { containers: Array<{ resources: { limits: Record<string, unknown> } }> } } } };
  broken.spec.template.spec.containers[0]!.resources.limits.memory = { gi: 64 };
  assert.throws(() => new DaemonSet(broken as never).validate(), /limits\/memory/);
});

interface Container {
  name: string;
  command?: string[];
  args?: string[];
  resources?: { limits?: Record<string, unknown>; requests?: Record<string, unknown> };
  volumeMounts?: Array<{ name: string; mountPath: string }>;
}

test('the DaemonSet runs the keeper beside the daemon: one socket, one uid, private directories, no GPU', () => {
  const ds = parse(readFileSync(join(repoRoot, 'deploy/kubernetes/weightd-daemonset.yaml'), 'utf8')) as {
    kind: string;
    spec: { template: { spec: { securityContext: { runAsUser: number }; shareProcessNamespace?: boolean; containers: Container[]; initContainers: Container[]; volumes: Array<{ name: string; emptyDir?: unknown }> } } };
  };
  assert.is(ds.kind, 'DaemonSet');
  const pod = ds.spec.template.spec;
  const keeper = pod.containers.find((c) => c.name === 'keeper')!;
  const daemon = pod.containers.find((c) => c.name === 'weightd')!;
  assert.ok(keeper && daemon, 'both containers');
  assert.is(keeper.command![0], '/opt/weightd/build/Release/weightd-keeper');
  const keeperSocket = keeper.command![keeper.command!.indexOf('--socket') + 1]!;
  const cli = parseCommand(daemon.args!);
  assert.is(cli.command, 'run');
  if (cli.command !== 'run') return;
  assert.equal(cli.options.keeper, { mode: 'external', socket: keeperSocket, adoptWithinS: undefined });
  // Both containers see the keeper's directory at the same path, from one pod-local volume.
  const mountOf = (c: Container) => c.volumeMounts!.find((m) => keeperSocket.startsWith(`${m.mountPath}/`));
  assert.is(mountOf(keeper)?.name, mountOf(daemon)?.name);
  assert.ok(pod.volumes.find((v) => v.name === mountOf(keeper)!.name)?.emptyDir !== undefined, 'an emptyDir, not shared with other pods');
  // The keeper refuses a world-writable directory (an emptyDir is 0777): the init container makes it 0700.
  const init = pod.initContainers.map((c) => c.command!.join(' ')).join('\n');
  assert.match(init, /chmod 0700/);
  assert.ok(pod.initContainers.some((c) => c.volumeMounts!.some((m) => m.mountPath === mountOf(keeper)!.mountPath)));
  assert.ok(Number.isInteger(pod.securityContext.runAsUser), 'one uid for the pod: the keeper answers only its own');
  // The keeper knows a record's owner by pid: from another pid namespace the daemon's is 0, which
  // it takes for an owner gone, and every record would expire while the daemon serves.
  assert.is(pod.shareProcessNamespace, true, 'the keeper and the daemon in one pid namespace');
  assert.not.ok(JSON.stringify(keeper.resources ?? {}).includes('nvidia.com/gpu'), 'the keeper holds no GPU');
});

test.run();
