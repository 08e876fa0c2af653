// A keeper that answers but fails LIST costs the start what it holds (no model loaded at run time,
// no written version is restored): the daemon says so at warn, naming the code (issue 31). Where
// no keeper answers at all the keeper link has already warned, and the LIST's failure stays at
// debug. The keeper here is a stand-in on the wire (docs/spec/keeper-wire.md) that answers PING,
// holds WATCH and fails every other request with E_INTERNAL.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KEEPER_HEADER_BYTES, KEEPER_MAGIC, KEEPER_PROTOCOL_VERSION, KeeperOp } from '../../src/keeper/keeperProtocol.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';

function frame(payload: Buffer): Buffer {
  const header = Buffer.alloc(KEEPER_HEADER_BYTES);
  KEEPER_MAGIC.copy(header);
  header.writeUInt16BE(KEEPER_PROTOCOL_VERSION, 4);
  header.writeUInt32BE(payload.length, 6);
  return Buffer.concat([header, payload]);
}

const str = (s: string) => {
  const b = Buffer.from(s);
  const len = Buffer.alloc(2);
  len.writeUInt16BE(b.length);
  return Buffer.concat([len, b]);
};

/** A keeper that answers PING (pid, version, no records), holds WATCH and fails every other request. */
function keeperFailingList(socket: string): Promise<Server> {
  const server = createServer((conn: Socket) => {
    let buffered = Buffer.alloc(0);
    conn.on('error', () => {});
    conn.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= KEEPER_HEADER_BYTES && buffered.length >= KEEPER_HEADER_BYTES + buffered.readUInt32BE(6)) {
        const end = KEEPER_HEADER_BYTES + buffered.readUInt32BE(6);
        const op = buffered[KEEPER_HEADER_BYTES];
        buffered = buffered.subarray(end);
        if (op === KeeperOp.watch) continue;
        if (op === KeeperOp.ping) {
          const body = Buffer.alloc(25);
          body.writeUInt32BE(process.pid, 1);
          body.writeUInt32BE(KEEPER_PROTOCOL_VERSION, 5);
          conn.write(frame(body));
        } else {
          conn.write(frame(Buffer.concat([Buffer.of(1), str('E_INTERNAL'), str(`the keeper failed: op ${op} fails here`)])));
        }
      }
    });
  });
  return new Promise((resolve) => server.listen(socket, () => resolve(server)));
}

test("a keeper that fails LIST: the daemon warns that nothing it holds is restored, naming the keeper's code", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-keeper-'));
  const socket = join(dir, 'keeper.sock');
  const server = await keeperFailingList(socket);
  try {
    const daemon = await startDaemon({ model: exampleModel, extraArgs: ['--keeper', 'external', '--keeper-socket', socket] });
    try {
      assert.match(
        daemon.stderr(),
        /"level":40,[^\n]*"code":"E_INTERNAL","reason":"keeper: the keeper failed: op 4 fails here","msg":"the keeper took the LIST request and failed it \(keeper: the keeper failed: op 4 fails here\): no model loaded at run time and no written version is restored/,
      );
    } finally {
      await daemon.stop();
    }
  } finally {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
