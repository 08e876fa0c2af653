// The node's link to its keeper (src/keeper/keeperLink.ts) says when no keeper answers a start's
// first PING, before it spawns one: the node then begins what a load needs (its ranks' warm
// threads, src/startNode.ts) while the keeper starts, instead of after. It says so once, at the
// start: not when a keeper already answers, and not when a lost keeper is replaced later.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KeeperLink } from '../../src/keeper/keeperLink.js';
import { capturedLog } from '../helpers/capturedLog.js';
import { keeperPid, killKeeper, waitUntil } from '../helpers/keeper.js';
import { freshSocketDir } from '../helpers/paths.js';

test('a spawning start is told before its keeper starts, once; a start that finds a keeper, and a replaced keeper, are not', async () => {
  const dir = freshSocketDir();
  const socket = join(dir, 'keeper.sock');
  const client = new KeeperClient(socket);
  const { logger } = capturedLog();
  const seen: Array<{ socketThere: boolean; started: boolean }> = [];
  let started = false;
  let back!: () => void;
  const backAgain = new Promise<void>((resolve) => (back = resolve));
  const first = new KeeperLink({ mode: 'spawn', socket, adoptWithinS: 60, log: logger, onBack: () => back(), onNoneAtStart: () => seen.push({ socketThere: existsSync(socket), started }) });
  const second = new KeeperLink({ mode: 'spawn', socket, adoptWithinS: 60, log: logger, onBack: () => {}, onNoneAtStart: () => assert.unreachable('a keeper answered') });
  try {
    await first.start().then(() => (started = true));
    assert.equal(seen, [{ socketThere: false, started: false }], 'told once, before the keeper it spawns serves');
    assert.ok(first.startedHere);
    const pid = await keeperPid(client);

    await second.start();
    assert.not.ok(second.startedHere);
    await second.close();

    // The first link spawns a keeper again when its keeper dies: a start's word is said no more.
    await killKeeper(client);
    await backAgain;
    assert.not.equal(await keeperPid(client), pid);
    assert.equal(seen.length, 1, 'told again when a lost keeper was replaced');
  } finally {
    await first.close();
    await second.close();
    await killKeeper(client);
  }
});

test('an external keeper absent at the start: told once, and not again while it is looked for', async () => {
  const dir = freshSocketDir();
  const { logger } = capturedLog();
  let told = 0;
  const link = new KeeperLink({ mode: 'external', socket: join(dir, 'keeper.sock'), adoptWithinS: 60, log: logger, onBack: () => {}, onNoneAtStart: () => told++ });
  try {
    await link.start();
    assert.is(told, 1);
    assert.is(link.status().state, 'absent');
    // It looks again every second: wait for one more look, then count again.
    const before = link.status().since;
    await waitUntil('the keeper looked for again', () => link.status().since !== before);
    assert.is(told, 1, 'told again when the keeper was looked for again');
  } finally {
    await link.close();
  }
});

test.run();
