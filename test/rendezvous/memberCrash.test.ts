// A member whose machine fails (a throwing action: a bug in weightd) drops its link to node 0
// at once: the stopped machine ignores CLOSE, so nothing else would, and its socket and timers
// would outlive it. Node 0 sees the link go during loading and fails the group now, not at a
// peer timeout (a minute here).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { GroupMember } from '../../src/rendezvous/groupMember.js';
import { closeLeftovers, FAST, joinRequest, silent, startCoordinator, startNodes, track } from './groupHarness.js';

const two = { nnodes: 2, localWorldSize: 1, timing: { peerTimeoutMs: 60_000 } };

test("a member whose machine fails closes its link to node 0, and the group fails at once", async () => {
  const coordinator = await startCoordinator(two);
  const [healthy] = startNodes(coordinator.port, two, [0]);
  const failures: string[] = [];
  const broken = new GroupMember({
    host: '127.0.0.1',
    port: coordinator.port,
    join: joinRequest(two, 1),
    rendezvousTimeoutMs: 5000,
    timing: { ...FAST, peerTimeoutMs: 60_000 },
    log: silent,
    emit: (e) => {
      if (e.type === 'GROUP_JOINED') throw new Error('a bug in what hears GROUP_JOINED');
      if (e.type === 'GROUP_FAILED') failures.push(e.error.message);
    },
  });
  track(broken).start();
  await healthy!.next('GROUP_FAILED', 10_000);
  assert.is(healthy!.failure().code, 'E_RDZV_PEER_LOST', healthy!.failure().message);
  assert.match(failures.join(), /a bug in what hears GROUP_JOINED/);
});

test.after.each(closeLeftovers);
test.run();
