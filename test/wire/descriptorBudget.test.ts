// The process's descriptors shared out among listeners (src/wire/descriptorBudget.ts): each
// listener's guarantee is its own, only trusted listeners draw on the reserve, a destroyed
// connection gives its descriptor back at once, and a low RLIMIT_NOFILE shrinks the untrusted first.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { UsageError } from '../../src/errors.js';
import { DescriptorBudget, openFileLimit, type ListenerShare } from '../../src/wire/descriptorBudget.js';
import { freshTempDir } from '../helpers/paths.js';

/** Takes `n` connections on `share`; returns those admitted and the last refusal's message. */
function fill(share: ListenerShare, n: number): { taken: PassThrough[]; refused?: string } {
  const taken: PassThrough[] = [];
  for (let i = 0; i < n; i++) {
    const s = new PassThrough();
    const refusal = share.take(s);
    if (refusal) return { taken, refused: refusal.message };
    taken.push(s);
  }
  return { taken };
}

test('guarantees are kept apart, the reserve goes to trusted listeners only, and a destroyed connection counts out at once', () => {
  const budget = new DescriptorBudget(400);
  assert.is(budget.pool, 300, 'a quarter is the process own');
  const device = budget.share({ name: 'device a', cap: 1024, guaranteed: 32, trusted: true });
  const control = budget.share({ name: 'control socket', cap: 16, guaranteed: 16, trusted: true });
  const inspect = budget.share({ name: 'inspect server', cap: 64, guaranteed: 8, trusted: false });
  assert.equal([inspect.guaranteed, inspect.cap], [64, 64], 'an untrusted listener is given its cap, and no more');
  assert.is(budget.reserveFree(), 300 - 32 - 16 - 64);

  const flood = fill(inspect, 1000);
  assert.is(flood.taken.length, 64);
  assert.is(flood.refused, 'inspect server: 64 connections are open, its most');

  const devices = fill(device, 1024);
  assert.is(devices.taken.length, 32 + 188, 'its guarantee, then the whole reserve');
  assert.is(devices.refused, 'device a: the descriptors lent to connections (300 of RLIMIT_NOFILE 400) are all in use');
  assert.is(fill(control, 16).taken.length, 16, 'the control socket still has its guarantee');

  devices.taken[0]!.destroy();
  assert.is(fill(device, 1).taken.length, 1, 'the destroyed one no longer counts, before its close event');

  control.close();
  assert.is(budget.reserveFree(), 16, 'a closed share gives its guarantee back to the reserve');
});

test('a low RLIMIT_NOFILE: guarantees are granted in order while the pool lasts; the inspect server may then get none', () => {
  const budget = new DescriptorBudget(100);
  assert.is(budget.pool, 36);
  assert.is(budget.share({ name: 'device', cap: 1024, guaranteed: 32, trusted: true }).guaranteed, 32);
  assert.is(budget.share({ name: 'control socket', cap: 16, guaranteed: 16, trusted: true }).guaranteed, 4);
  const inspect = budget.share({ name: 'inspect server', cap: 64, guaranteed: 64, trusted: false });
  assert.equal([inspect.guaranteed, inspect.cap], [0, 0]);
  assert.is(fill(inspect, 1).refused, 'inspect server: 0 connections are open, its most');
});

test('the untrusted listeners together are guaranteed at most a quarter of the pool, even when they start first; a coordinator left fewer than its nodes fails the start', () => {
  const budget = new DescriptorBudget(256);
  assert.is(budget.pool, 192);
  assert.is(budget.share({ name: 'inspect server', cap: 64, guaranteed: 64, trusted: false }).cap, 48);
  const nodes = { count: 2, of: 'nodes (--nnodes)' };
  try {
    budget.share({ name: 'rendezvous coordinator', cap: 260, guaranteed: 260, trusted: false, atLeast: nodes });
    assert.unreachable('a coordinator granted 0 connections for 2 nodes is refused');
  } catch (err) {
    assert.instance(err, UsageError);
    assert.is((err as UsageError).code, 'E_FD_LIMIT');
    assert.match((err as Error).message, /^the rendezvous coordinator is granted 0 connections of RLIMIT_NOFILE 256, fewer than its 2 nodes \(--nnodes\) .*: raise `ulimit -n`/);
  }
  assert.is(budget.share({ name: 'device', cap: 1024, guaranteed: 32, trusted: true }).guaranteed, 32, 'the refused share holds nothing back');
  assert.is(budget.reserveFree(), 192 - 48 - 32);
  assert.is(new DescriptorBudget(4096).share({ name: 'rendezvous coordinator', cap: 260, guaranteed: 260, trusted: false, atLeast: nodes }).guaranteed, 260);
});

test('openFileLimit reads the soft limit of /proc/self/limits', () => {
  const file = join(freshTempDir(), 'limits');
  writeFileSync(file, 'Limit                     Soft Limit           Hard Limit           Units     \nMax open files            20000                1048576              files     \n');
  assert.is(openFileLimit(file), 20000);
  assert.ok(openFileLimit() > 0);
});

test.run();
