// Peer admission (src/wire/peerAdmission.ts): who the peer is is checked before whether there is
// room, so a peer of another user is refused as a stranger even when the listener is full, and
// learns nothing of its limit; our own user's peer at the cap is refused for want of room.
import { once } from 'node:events';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DescriptorBudget } from '../../src/wire/descriptorBudget.js';
import { admitPeer, type Admission } from '../../src/wire/peerAdmission.js';
import { freshSocketDir } from '../helpers/paths.js';

/** Admits one real Unix-socket peer (this process, so our uid) against `uid` and a share that is full. */
async function admitAtCap(uid: number): Promise<Admission> {
  const share = new DescriptorBudget(400).share({ name: 'device a', cap: 1, guaranteed: 1, trusted: true });
  assert.is(share.take(new PassThrough()), undefined, 'the one connection it may hold');
  const server = createServer();
  const path = join(freshSocketDir(), 'a.sock');
  server.listen(path);
  await once(server, 'listening');
  const client = connect(path);
  const [socket] = (await once(server, 'connection')) as [Socket];
  const admission = admitPeer(socket, { uid, share });
  socket.destroy();
  client.destroy();
  server.close();
  return admission;
}

test('a peer of another user at the cap is refused as a stranger, with no limit to learn', async () => {
  const admission = await admitAtCap(process.getuid!() + 1);
  assert.ok(!admission.admitted);
  assert.equal([admission.otherUser, admission.full], [true, false]);
  assert.not.ok('limit' in admission.fields, 'the limit is not in what is logged for a stranger either');
});

test("our own user's peer at the cap is refused for want of room, with the limit", async () => {
  const admission = await admitAtCap(process.getuid!());
  assert.ok(!admission.admitted);
  assert.equal([admission.otherUser, admission.full, admission.fields.limit], [false, true, 1]);
});

test.run();
