// Leases decide when memory may be freed: a client that maps memory must keep it mapped until
// it detaches, whatever happens to its connection, and whatever pid namespace it lives in.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { leaseHash, leaseInfo, LeaseTable, MAX_LEASES_PER_CLIENT } from '../../src/serve/leaseTable.js';

const me = { pid: process.pid, connectionId: 1 };

test('a map lease outlives its connection; a copy lease ends with it', () => {
  const t = new LeaseTable();
  const map = t.grant(me, 'map');
  const copy = t.grant({ ...me, connectionId: 2 }, 'copy');
  assert.equal(t.connectionClosed(1), []);
  assert.equal(t.connectionClosed(2).map((l) => l.id), [copy.id]);
  assert.equal(t.othersThan({ pid: 1, connectionId: 9 }).map((l) => l.id), [map.id]);
});

test('one client holds at most MAX_LEASES_PER_CLIENT leases on a version: the next is refused by name, others are not, and a detach makes room', () => {
  const t = new LeaseTable();
  const held = Array.from({ length: MAX_LEASES_PER_CLIENT }, () => t.grant(me, 'map'));
  const refusal = (() => {
    try {
      t.grant({ ...me, connectionId: 2 }, 'copy');
    } catch (err) {
      return err as { code: string; message: string };
    }
    return assert.unreachable('granted past the bound') as never;
  })();
  assert.is(refusal.code, 'E_TOO_MANY_LEASES');
  assert.match(refusal.message, new RegExp(`process ${process.pid} holds ${MAX_LEASES_PER_CLIENT} leases on this version, its most .*detach the ones it no longer maps`));
  assert.is(t.size, MAX_LEASES_PER_CLIENT, 'nothing granted');
  assert.ok(t.grant({ pid: 1, connectionId: 9 }, 'map'), 'another process is not bounded by this one');
  t.detach(me, held[0]!.id);
  assert.ok(t.grant(me, 'map'), 'a detach makes room');
});

test('a client of unknown pid (another pid namespace) keeps its map lease after closing, and blocks release', () => {
  const t = new LeaseTable();
  const sidecar = { pid: 0, connectionId: 5 };
  const lease = t.grant(sidecar, 'map');
  assert.equal(t.connectionClosed(5), [], 'closing the socket does not end the lease: the mapping is still live');
  assert.equal(t.expireDead(), [], 'an unknown pid never expires by itself');
  assert.equal(t.othersThan(me).map((l) => l.id), [lease.id], 'another client cannot release under it');
  // After a reconnect (new connection id) it detaches by its secret lease id.
  assert.equal(t.detach({ pid: 0, connectionId: 6 }, 'not-its-id'), []);
  assert.equal(t.detach({ pid: 0, connectionId: 6 }, lease.id).map((l) => l.id), [lease.id]);
  assert.is(t.size, 0);
});

test('a lease of a known pid is detached only by that pid', () => {
  const t = new LeaseTable();
  const lease = t.grant(me, 'map');
  assert.equal(t.detach({ pid: 1, connectionId: 7 }, lease.id), [], 'another process cannot drop it');
  assert.equal(t.detach({ ...me, connectionId: 8 }, lease.id).map((l) => l.id), [lease.id]);
});

test('what others see of a lease (stats, error details) never holds its id', () => {
  const t = new LeaseTable();
  const lease = t.grant({ pid: 0, connectionId: 1 }, 'map');
  const shown = JSON.stringify([t.list(), leaseInfo(lease)]);
  assert.not.ok(shown.includes(lease.id), shown);
  assert.is(t.list()[0]!.leaseHash, leaseHash(lease.id));
  // Another client of unknown pid cannot end it: not by connection, not by what stats shows.
  const stranger = { pid: 0, connectionId: 2 };
  assert.equal(t.detach(stranger), []);
  assert.equal(t.detach(stranger, t.list()[0]!.leaseHash), []);
  assert.equal(t.othersThan(stranger).map((l) => l.id), [lease.id], 'its release is refused');
  assert.is(t.size, 1);
});

test('dead clients\' leases expire', () => {
  const t = new LeaseTable();
  t.grant({ pid: 2 ** 22 + 12345, connectionId: 3 }, 'map'); // beyond pid_max: never a live pid
  assert.is(t.expireDead().length, 1);
  assert.is(t.size, 0);
});

test.run();
