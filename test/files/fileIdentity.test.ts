// The identity rule (src/files/fileIdentity.ts, docs/spec/file-identity.md) on real files: a file
// replaced by mv with the same size and mtime (a new inode), and one written and touched back to
// its mtime (only ctime moves), are both found, named and said how; a file left alone is not. A
// version's check (src/serve/filesCheck.ts) turns stale for good and says so once.
import { spawnSync } from 'node:child_process';
import { closeSync, openSync, renameSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { changedFiles, describeChange, fileIdentities } from '../../src/files/fileIdentity.js';
import { FilesCheck } from '../../src/serve/filesCheck.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { afterCtimeOf } from '../helpers/fileClock.js';

let dir = '';
test.before.each(() => {
  dir = makeTempDir('identity');
});
test.after.each(() => removeDir(dir));

/** touch(1) copies timestamps to the nanosecond (utimensat), which fs.utimes cannot. */
function touch(...args: string[]): void {
  const r = spawnSync('touch', args, { encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
}

function shard(name = 'model.safetensors', byte = 0x11): string {
  const path = join(dir, name);
  writeFileSync(path, Buffer.alloc(64 << 10, byte));
  return path;
}

test('a file left alone is unchanged', async () => {
  const recorded = fileIdentities([shard()]);
  assert.equal(await changedFiles(recorded), []);
});

test('replaced by mv, same size and mtime: a new inode, "(replaced)"', async () => {
  const path = shard();
  const recorded = fileIdentities([path]);
  const other = shard('download.tmp', 0x22);
  touch('-r', path, other);
  renameSync(other, path);
  assert.is(statSync(path).size, recorded[0]!.size);
  assert.is(String(statSync(path, { bigint: true }).mtimeNs), recorded[0]!.mtimeNs, 'same mtime');
  const changes = await changedFiles(recorded);
  assert.is(changes.length, 1);
  assert.is(changes[0]!.field, 'ino');
  assert.match(describeChange(changes[0]!), new RegExp(`^model\\.safetensors: inode ${recorded[0]!.ino} -> \\d+ \\(replaced\\)$`));
});

test('one byte written in place, mtime put back (touch -d): ctime moved, "(written)"', async () => {
  const path = shard();
  const recorded = fileIdentities([path]);
  const stamp = join(dir, 'stamp');
  touch('-r', path, stamp);
  afterCtimeOf(path);
  const fd = openSync(path, 'r+');
  writeSync(fd, Buffer.from([0x99]), 0, 1, 4096 + 100);
  closeSync(fd);
  touch('-m', '-r', stamp, path);
  assert.is(String(statSync(path, { bigint: true }).mtimeNs), recorded[0]!.mtimeNs, 'mtime put back');
  const changes = await changedFiles(recorded);
  assert.is(changes.length, 1);
  assert.is(changes[0]!.field, 'ctime');
  assert.match(describeChange(changes[0]!), new RegExp(`^model\\.safetensors: ctime ${recorded[0]!.ctimeNs} -> \\d+ \\(written\\)$`));
});

test('a file gone is named with why', async () => {
  const recorded = fileIdentities([shard()]);
  removeDir(dir);
  const [change] = await changedFiles(recorded);
  assert.is(describeChange(change!), 'model.safetensors: gone (ENOENT)');
});

test('a version\'s check: stale once a file changed, for good, its listeners told once', async () => {
  const path = shard();
  const check = new FilesCheck(fileIdentities([path]), 0);
  const heard: string[] = [];
  check.onStale((changes) => heard.push(changes.map(describeChange).join('; ')));
  assert.is(await check.check(), undefined);
  assert.is(check.stale, undefined);
  afterCtimeOf(path);
  writeFileSync(path, Buffer.alloc(64 << 10, 0x33));
  const [first, second] = await Promise.all([check.check(), check.check()]);
  assert.is(first?.[0]?.path, path);
  assert.is(second, first);
  assert.is(heard.length, 1);
  // A listener that comes later hears it at once.
  check.onStale(() => heard.push('late'));
  assert.equal(heard.slice(1), ['late']);
  assert.is(await check.check(), first, 'stale for good');
});

test.run();
