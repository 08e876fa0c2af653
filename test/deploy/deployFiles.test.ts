// deploy/ as far as a machine without systemd as PID 1 or a cluster allows: systemd itself
// checks the units (systemd-analyze verify, with the paths pointed at this checkout's build),
// their command lines are the ones weightd and its keeper accept, and the DaemonSet wires the
// keeper to the daemon (the same socket, the same uid, private directories, no GPU).
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
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

/** A unit as installed from this checkout: /opt/weightd is the repository, node is this node. */
function localUnit(text: string): string {
  return text.replaceAll('/opt/weightd/', repoRoot).replaceAll('/usr/bin/node', process.execPath);
}

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
  const cli = parseCommand(daemon.slice(2));
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
    spec: { template: { spec: { securityContext: { runAsUser: number }; containers: Container[]; initContainers: Container[]; volumes: Array<{ name: string; emptyDir?: unknown }> } } };
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
  assert.not.ok(JSON.stringify(keeper.resources ?? {}).includes('nvidia.com/gpu'), 'the keeper holds no GPU');
});

test.run();
