// The keeper under AddressSanitizer and LeakSanitizer: its ASan build (build-asan/, as
// test/native/asan.test.ts builds the addon) goes through keeps of several batches, takes,
// replacements, drops, an owner's expiry, bad input, a KEEP past 1 MiB (reserved from the budget)
// and connections closed by their deadlines (a stalled request, an idle client), then stops on SIGTERM with records still
// held, so every record, owner and connection is torn down and LSan sees the whole heap.
import { spawnSync } from 'node:child_process';
import { closeSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { encodePing } from '../../src/keeper/keeperProtocol.js';
import { addon } from '../../src/native/addon.js';
import { memfdWith, startTestKeeper, waitUntil } from '../helpers/keeper.js';
import { repoRoot } from '../helpers/paths.js';
import { runFixture } from '../helpers/runFixture.js';

const cmakeJs = join(repoRoot, 'node_modules', 'cmake-js', 'bin', 'cmake-js');
const keepAndExit = fileURLToPath(new URL('./fixtures/keepAndExit.js', import.meta.url));
const asanKeeper = join(repoRoot, 'build-asan', 'Release', 'weightd-keeper');

test.before(() => {
  // The keeper target only: seconds, where the addon's ASan build takes a minute.
  const args = ['compile', '--out', 'build-asan', '--CDWEIGHTD_ASAN=ON', '--target', 'weightd-keeper', '--parallel', String(availableParallelism())];
  const r = spawnSync(process.execPath, [cmakeJs, ...args], { cwd: repoRoot, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`cannot build the ASan keeper into build-asan/:\n${r.stdout}\n${r.stderr}`);
});

test('keep, take, replace, drop, expire, bad input, deadlines, then SIGTERM holding records: no ASan error, no leak', async () => {
  const keeper = await startTestKeeper(['--adopt-within', '0.2', '--request-timeout', '0.5', '--idle-timeout', '0.5'], { binary: asanKeeper });
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    await keeper.client.keep('host-0', 'a', Buffer.alloc(100_000, 1), Array(600).fill(memfd));
    await keeper.client.keep('host-0', 'a', Buffer.from('again'), [memfd]);
    await keeper.client.keep('host-1', 'b', Buffer.from('b'), [memfd, memfd]);
    const taken = await keeper.client.take('host-0', 'a');
    for (const fd of taken.fds) addon().closeFd(fd);
    await keeper.client.take('host-0', 'missing').catch(() => {});
    assert.is(await keeper.client.drop('host-1'), 1);
    await runFixture(keepAndExit, [keeper.socket, 'host-2', `/proc/${process.pid}/fd/${memfd}`, 'c']);
    await waitUntil('the dead owner\'s record expires', async () => !(await keeper.client.list()).some((r) => r.device === 'host-2'));
    await addon().unixRequest(keeper.socket, encodePing(), [memfd], 5000, 1 << 20);
    await addon().unixRequest(keeper.socket, Buffer.from('WGTK\x00\x01\x00\x00\x00\x03\x02\x00\x09', 'latin1'), [], 5000, 1 << 20);
    await keeper.client.keep('host-3', 'large', Buffer.alloc(2 << 20, 3), [memfd]);
    const large = await keeper.client.take('host-3', 'large');
    for (const fd of large.fds) addon().closeFd(fd);
    assert.equal(large.record, Buffer.alloc(2 << 20, 3));
    let closed = 0;
    const stalled = connect(keeper.socket, () => stalled.write(Buffer.from('WGTK\x00\x01\x00\x00\x00\x09\x02', 'latin1')));
    const idle = connect(keeper.socket);
    // Read (and dropped): the stalled one's E_READ_TIMEOUT comes before its end.
    for (const s of [stalled, idle]) s.on('error', () => {}).on('close', () => closed++).resume();
    await waitUntil('the stalled and the idle client are closed', () => closed === 2);
    const watch = await keeper.client.watch();
    await keeper.client.ping();
    process.kill(keeper.pid, 'SIGTERM');
    const end = await keeper.exited;
    watch.destroy();
    const report = keeper.stderr().indexOf('==ERROR: ');
    assert.is(report, -1, `the sanitizer reported:\n${keeper.stderr().slice(report, report + 20_000)}`);
    assert.equal(end, { code: 0, signal: null }, keeper.stderr());
  } finally {
    closeSync(memfd);
    await keeper.kill();
  }
});

test.run();
