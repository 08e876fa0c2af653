// A keeper of a build before 2026-12-05 refuses a request past 1 MiB on its header
// (docs/spec/keeper-wire.md §1, §5). The kept plan (src/keeper/keptPlan.ts) rides in local rank
// 0's record and can push it past that: the rank keeps its shard without the plan then (the plan
// spares the next start its headers; the shard spares it the load), and says so once. Against a
// stand-in keeper on a Unix socket that answers as the earlier build does: E_FRAME_TOO_LARGE on
// the header, then the connection closed. Such a keeper, once found, is remembered by its pid for
// the daemon's life (RankKeeping.earlierKeeper, shared by every rank's thread), so it refuses one
// KEEP per daemon rather than one per model and keep.
import { closeSync, openSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { keepSegments } from '../../src/actors/rankKeeping.js';
import type { RankKeeping, RankToMain, RankWorkerData } from '../../src/models/rankMessages.js';
import { KEEPER_HEADER_BYTES, KEEPER_MAGIC, KEEPER_V1_MAX_REQUEST_BYTES, KeeperOp } from '../../src/keeper/keeperProtocol.js';
import type { KeptPlan } from '../../src/keeper/keptPlan.js';
import { freshSocketDir } from '../helpers/paths.js';

interface StandIn {
  socket: string;
  /** The records it took, in order. */
  kept: Buffer[];
  /** Requests it refused on their header. */
  refused: number;
  /** Whole KEEPs it read and refused with `refuseWith`. */
  full: number;
  /** PINGs it answered, and the pid it answers with (a keeper that replaced it: another). */
  pings: number;
  pid: number;
  close(): Promise<void>;
}

const frame = (payload: Buffer) => {
  const header = Buffer.alloc(KEEPER_HEADER_BYTES);
  KEEPER_MAGIC.copy(header);
  header.writeUInt16BE(1, 4);
  header.writeUInt32BE(payload.length, 6);
  return Buffer.concat([header, payload]);
};
const str = (s: string) => {
  const b = Buffer.from(s);
  const len = Buffer.alloc(2);
  len.writeUInt16BE(b.length);
  return Buffer.concat([len, b]);
};

/**
 * A keeper that takes a KEEP of at most `maxRequestBytes` (its descriptors are dropped: no record
 * is adopted here); with `refuseWith`, one of this build that reads each KEEP whole and refuses it
 * with that code (E_KEEPER_FULL: it holds all the records a LIST may carry).
 */
async function standInKeeper(maxRequestBytes: number, refuseWith?: string): Promise<StandIn> {
  const socket = join(freshSocketDir(), 'keeper.sock');
  const state = { socket, kept: [] as Buffer[], refused: 0, full: 0, pings: 0, pid: 4242 };
  const serve = (conn: Socket) => {
    let buf = Buffer.alloc(0);
    conn.on('error', () => {});
    conn.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (buf.length < KEEPER_HEADER_BYTES) return;
      const length = buf.readUInt32BE(6);
      if (length > maxRequestBytes) {
        state.refused++;
        conn.end(frame(Buffer.concat([Buffer.of(1), str('E_FRAME_TOO_LARGE'), str(`the keeper says: a request of ${length} bytes exceeds ${maxRequestBytes}`)])));
        conn.destroySoon();
        buf = Buffer.alloc(0);
        return;
      }
      if (buf.length < KEEPER_HEADER_BYTES + length) return;
      const payload = buf.subarray(KEEPER_HEADER_BYTES, KEEPER_HEADER_BYTES + length);
      buf = buf.subarray(KEEPER_HEADER_BYTES + length);
      if (payload[0] === KeeperOp.ping) {
        state.pings++;
        const body = Buffer.alloc(1 + 4 * 4 + 8);
        body.writeUInt32BE(state.pid, 1);
        body.writeUInt32BE(1, 5);
        conn.write(frame(body));
        return;
      }
      assert.is(payload[0], KeeperOp.keep);
      if (refuseWith) {
        state.full++;
        conn.write(frame(Buffer.concat([Buffer.of(1), str(refuseWith), str('the keeper says: it is full')])));
        return;
      }
      let at = 1;
      for (let i = 0; i < 2; i++) at += 2 + payload.readUInt16BE(at);
      state.kept.push(Buffer.from(payload.subarray(at + 4, at + 4 + payload.readUInt32BE(at))));
      conn.write(frame(Buffer.of(0)));
    });
  };
  const server: Server = createServer(serve);
  await new Promise<void>((resolve) => server.listen(socket, resolve));
  return Object.assign(state, { close: () => new Promise<void>((resolve) => server.close(() => resolve())) });
}

const plan = {
  fingerprint: 'f'.repeat(64),
  segments: [4096],
  totalBytes: 4096,
  tpRank: 0,
  tpSize: 1,
  files: [],
  ops: [],
  zeroRanges: [],
  contentTensors: { names: ['w'], ranges: [] },
};
const data = { nodeRank: 0, localRank: 0, globalRank: 0, device: { backend: 'host', index: 0, uuid: 'earlier-keeper-0' }, cudaHandles: 'ipc', plan, files: [], fill: {} } as unknown as RankWorkerData;

/** A plan part of `bytes` bytes of brotli (random: it does not shrink). */
const keptPlan = (bytes: number): KeptPlan => ({
  format: 1,
  key: 'a'.repeat(64),
  fields: { planFormat: 1, writer: 'weightd test', planner: 'p', modelDir: '/m', tpSize: 1, planFile: null, layouts: [] },
  inputs: [],
  ranks: [plan.fingerprint],
  bytes,
  sha256: 'b'.repeat(64),
  brotli: randomBytes(bytes).toString('base64'),
});

async function keep(keeper: StandIn, keeping: Omit<RankKeeping, 'socket' | 'model' | 'writer'>, logs: RankToMain[], rank: RankWorkerData = data): Promise<void> {
  const fd = openSync('/dev/null', 'r');
  try {
    await keepSegments(rank, { socket: keeper.socket, model: '/m', writer: 'weightd test', ...keeping }, [{ segment: 0, fd } as never], ['0'.repeat(32)], (m) => logs.push(m));
  } finally {
    closeSync(fd);
  }
}

test("past an earlier keeper's 1 MiB with its plan: the shard is kept without the plan, and that is said once", async () => {
  const keeper = await standInKeeper(KEEPER_V1_MAX_REQUEST_BYTES);
  const logs: RankToMain[] = [];
  try {
    const part = keptPlan(900 << 10);
    await keep(keeper, { plan: part }, logs);
    assert.is(keeper.refused, 1, 'the record with its plan was refused on its header');
    assert.is(keeper.kept.length, 1, 'then the shard was kept');
    const record = JSON.parse(keeper.kept[0]!.toString('utf8')) as Record<string, unknown>;
    assert.is(record.plan, undefined, 'without the plan');
    assert.is(record.fingerprint, plan.fingerprint);
    // A keep again (a rollback, a keeper back) does the same, and says nothing new.
    await keep(keeper, { plan: part, currentSince: 1 }, logs);
    assert.is(keeper.kept.length, 2);
    const said = logs.filter((m) => m.type === 'LOG' && /with the model's plan/.test(m.msg));
    assert.is(said.length, 1, JSON.stringify(logs));
    assert.match((said[0] as { msg: string }).msg, /kept the shard without the plan, so the next start plans from the checkpoint's headers/);
  } finally {
    await keeper.close();
  }
});

test('an earlier keeper, once found, refuses one KEEP per daemon: every rank after it, and every keep again, goes without the plan at once', async () => {
  const keeper = await standInKeeper(KEEPER_V1_MAX_REQUEST_BYTES);
  const earlierKeeper = new Int32Array(new SharedArrayBuffer(4));
  const logs: RankToMain[] = [];
  // Two models' rank 0 (each its own device and thread; devices of their own in this file, whose shards' warnings are said once each): what the first one found is shared.
  const [first, other] = ['earlier-keeper-1', 'earlier-keeper-2'].map((uuid) => ({ ...data, device: { ...data.device, uuid } }) as RankWorkerData);
  try {
    const part = keptPlan(900 << 10);
    await keep(keeper, { plan: part, earlierKeeper }, logs, first);
    assert.is(keeper.refused, 1);
    assert.is(Atomics.load(earlierKeeper, 0), keeper.pid, 'the keeper is remembered by its pid');
    await keep(keeper, { plan: part, earlierKeeper, currentSince: 1 }, logs, first);
    await keep(keeper, { plan: part, earlierKeeper }, logs, other);
    assert.is(keeper.refused, 1, 'no second refusal: not for a keep again, nor for another rank');
    assert.is(keeper.kept.length, 3);
    assert.ok(keeper.kept.every((r) => (JSON.parse(r.toString('utf8')) as { plan?: unknown }).plan === undefined), 'each without the plan');
    const said = logs.filter((m) => m.type === 'LOG' && /with the model's plan/.test(m.msg));
    assert.is(said.length, 2, 'said once per shard');
    // A keeper of this build replaced it (another pid): it is sent the plan again.
    keeper.pid = 4343;
    const before = keeper.refused;
    await keep(keeper, { plan: part, earlierKeeper }, logs, first);
    assert.is(keeper.refused, before + 1, 'the new keeper is asked with the plan (this stand-in refuses it too)');
    assert.is(Atomics.load(earlierKeeper, 0), 4343);
  } finally {
    await keeper.close();
  }
});

test('a keeper of this build takes the same record with its plan, and nothing is said', async () => {
  const keeper = await standInKeeper(64 << 20);
  const logs: RankToMain[] = [];
  try {
    await keep(keeper, { plan: keptPlan(900 << 10), earlierKeeper: new Int32Array(new SharedArrayBuffer(4)) }, logs);
    assert.is(keeper.refused, 0);
    assert.is(keeper.pings, 0, 'no request but the KEEP: nothing was found to remember');
    assert.is(keeper.kept.length, 1);
    assert.ok((JSON.parse(keeper.kept[0]!.toString('utf8')) as { plan?: unknown }).plan !== undefined, 'the plan is kept');
    assert.equal(logs, []);
  } finally {
    await keeper.close();
  }
});

test("a keeper of this build that refuses by name (E_KEEPER_FULL) is not taken for an earlier one: no retry without the plan", async () => {
  const keeper = await standInKeeper(64 << 20, 'E_KEEPER_FULL');
  const logs: RankToMain[] = [];
  try {
    const err = await keep(keeper, { plan: keptPlan(1200 << 10) }, logs).then(
      () => undefined,
      (e: unknown) => e as { code?: string },
    );
    assert.is(err?.code, 'E_KEEPER_FULL', String(err));
    assert.is(keeper.full, 1, 'one KEEP, refused by name, and no second one without the plan');
    assert.is(keeper.kept.length, 0);
    assert.equal(logs, []);
  } finally {
    await keeper.close();
  }
});

test.run();
