// The keeper's side of its wire format (docs/spec/keeper-wire.md) against the shared vectors that
// test/keeper/keeperProtocol.test.ts holds the TypeScript side to: the C++ constants, and the
// exact reply frames a fresh keeper sends to the vectors' requests. (The refused frames are
// test/keeper/badInput.test.ts's, which also checks that no descriptor leaks.)
import { closeSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { addon } from '../../src/native/addon.js';
import { memfdWith, startTestKeeper, type TestKeeper } from '../helpers/keeper.js';
import { fromHex, keeperWire } from '../helpers/keeperWireVectors.js';
import { repoRoot } from '../helpers/paths.js';

const source = (file: string): string => readFileSync(join(repoRoot, 'native', file), 'utf8');

/** The value of `constexpr <type> <name> = <value>;` in a C++ header, integer expressions of literals and << evaluated. */
function constexprValue(header: string, name: string): string {
  const m = new RegExp(`constexpr [\\w:]+ ${name}(?:\\[\\])? = ([^;]+);`).exec(header);
  if (!m) throw new Error(`no constexpr ${name} in the header`);
  return m[1]!.trim();
}

const integer = (expr: string): number => {
  const shift = /^(\d+) << (\d+)$/.exec(expr);
  if (shift) return Number(shift[1]) * 2 ** Number(shift[2]);
  if (!/^\d+$/.test(expr)) throw new Error(`"${expr}" is not an integer literal this test reads`);
  return Number(expr);
};

test("keeper_wire.h's and scm_rights.h's constants are the vectors'", () => {
  const wire = source('keeper/keeper_wire.h');
  const scm = source('scm_rights.h');
  assert.equal(
    {
      magic: JSON.parse(constexprValue(wire, 'kMagic')) as string,
      protocolVersion: integer(constexprValue(wire, 'kProtocolVersion')),
      headerBytes: integer(constexprValue(wire, 'kHeaderBytes')),
      maxRequestBytes: integer(constexprValue(wire, 'kMaxRequestBytes')),
      maxOtherRequestBytes: integer(constexprValue(wire, 'kMaxOtherRequestBytes')),
      maxReplyBytes: integer(constexprValue(wire, 'kMaxReplyBytes')),
      maxRecordFds: integer(constexprValue(wire, 'kMaxRecordFds')),
      fdsPerBatch: integer(constexprValue(scm, 'kFdsPerBatch')),
      maxFdsPerMessage: integer(constexprValue(scm, 'kMaxFdsPerMessage')),
    },
    keeperWire.constants,
  );
  const ops = /enum class Op : uint8_t \{([^}]*)\}/.exec(wire)![1]!;
  const parsed = Object.fromEntries([...ops.matchAll(/(\w+) = (\d+)/g)].map((m) => [m[1]!.toUpperCase(), Number(m[2])]));
  assert.equal(parsed, keeperWire.ops);
});

let keeper: TestKeeper;
let memfd: number;

test.before(async () => {
  keeper = await startTestKeeper();
  memfd = await memfdWith(Buffer.from('x'));
});

test.after(async () => {
  closeSync(memfd);
  await keeper.kill();
});

// In order, on the one keeper: each exchange sees what the ones before it left.
test('a fresh keeper answers the vectors\' exchanges with their exact frames', async () => {
  for (const x of keeperWire.exchanges) {
    const reply = await addon().unixRequest(keeper.socket, fromHex(x.request), Array<number>(x.fds).fill(memfd), 5000, 1 << 20);
    for (const fd of reply.fds) closeSync(fd);
    if (x.reply !== undefined) {
      assert.is(reply.frame.toString('hex'), fromHex(x.reply).toString('hex'), x.why);
      continue;
    }
    assert.is(reply.frame[10], 1, `${x.why}: an error reply`);
    const codeLength = reply.frame.readUInt16BE(11);
    assert.is(reply.frame.toString('utf8', 13, 13 + codeLength), x.code, x.why);
  }
});

test.run();
