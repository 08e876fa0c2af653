// A host segment longer than one ArrayBuffer can be in this Node (buffer.constants.MAX_LENGTH,
// 4 GiB on Node 20) is refused by name before it is mapped, and its descriptor is closed: the
// alternative is Node-API aborting the process (a rank of 4.3 GB did, before this check).
import { constants } from 'node:buffer';
import { closeSync, openSync, readdirSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { openHost } from '../../src/client/segmentAccess.js';
import type { StateReply } from '../../src/wire/protocol.js';
import { exampleModel } from '../helpers/paths.js';

test('a segment over buffer.constants.MAX_LENGTH: E_SEGMENT_TOO_LARGE naming it, and the descriptor closed', () => {
  const bytes = constants.MAX_LENGTH + 4096;
  const state = { segments: [{ segment: 0, bytes, handle: 'fd' }], tensors: [], aliases: {} } as unknown as StateReply;
  const fd = openSync(`${exampleModel}/config.json`, 'r');
  const open = () => readdirSync('/proc/self/fd').length;
  const before = open();
  let err: (Error & { code?: string }) | undefined;
  try {
    openHost(state, false, new Map([[0, fd]]));
  } catch (e) {
    err = e as Error & { code?: string };
  }
  assert.is(err?.code, 'E_SEGMENT_TOO_LARGE');
  assert.match(err!.message, new RegExp(`segment 0 holds ${bytes} bytes, more than one ArrayBuffer can in Node .* \\(${constants.MAX_LENGTH}\\); attach from Python`));
  assert.is(open(), before - 1, 'the descriptor was closed');
  assert.throws(() => closeSync(fd), /EBADF/);
});

test.run();
