// A checkpoint file changed while weightd serves it, with no keeper (issue 29): one byte of a
// 48 MiB tensor, outside the fingerprint's content sample, so an engine's expected fingerprint
// still matches. The next get_state is refused (E_STALE) or, once reloaded, serves the new bytes:
// never the old ones to a new attach. The log, /status and a watcher that asked name the file and
// how it changed; the model is loaded again by the hot swap's path; a client that held a lease
// keeps reading its bytes until it lets go; then nothing is left of the stale version.
import { mkdirSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient, type ModelEvent } from '../../src/client/index.js';
import { errorCode } from '../../src/errors.js';
import { toStatusView } from '../../src/inspect/statusView.js';
import { startNode, type WeightdNode } from '../../src/index.js';
import { capturedLog } from '../helpers/capturedLog.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { afterCtimeOf } from '../helpers/fileClock.js';
import { waitUntil } from '../helpers/keeper.js';
import { fdTargets, weightdMemfds } from '../helpers/memfds.js';
import { flipUnsampledByte, tensorBytes, TENSOR, writeSingleTensorModel } from '../helpers/singleTensorModel.js';

/** The tensor's bytes as a host attach maps them. */
const mapped = (data: ArrayBufferView) => Buffer.from(data.buffer, data.byteOffset, data.byteLength);

test('one byte changed outside the sample while serving: never served to a new attach, named, reloaded; a lease keeps its bytes; nothing leaks', async () => {
  const dir = makeTempDir('stale');
  process.env.WEIGHTD_SERVE_FILES_CHECK_MS = '0';
  const log = capturedLog();
  let node: WeightdNode | undefined;
  const clients: WeightdClient[] = [];
  try {
    mkdirSync(`${dir}/one48`);
    const m = await writeSingleTensorModel(`${dir}/one48`);
    const socketDir = `${dir}/s`;
    node = await startNode({ model: m.dir, device: 'host', socketDir, logger: log.logger, progress: false });
    await node.ready;
    const socket = await findSocket({ socketDir, globalRank: 0 });
    const expected = await expectedFingerprint(m.dir, 1, 0);
    const connect = async () => (clients[clients.push(await WeightdClient.connect(socket)) - 1]!);
    // Sockets, files and segments: a thread's event loop (pipes, eventfd, epoll) is the new version's rank worker.
    const held0 = () => fdTargets('self').filter((t) => !/^(pipe|anon_inode):/.test(t)).sort();
    const baselineFds = held0();

    const watcher = await connect();
    const events: ModelEvent[] = [];
    watcher.onEvent((e) => events.push(e));
    await watcher.watch('one48', { stale: true });
    const holder = await connect();
    const held = await holder.attach(expected);
    assert.is(held.status, 'attached');
    if (held.status !== 'attached' || held.backend !== 'host') return;
    const before = tensorBytes(m);
    assert.ok(mapped(held.tensors[TENSOR]!.data).equals(before), 'the lease maps the file\'s bytes');

    afterCtimeOf(m.file);
    flipUnsampledByte(m);
    const after = tensorBytes(m);
    assert.not.ok(after.equals(before));
    assert.equal(await expectedFingerprint(m.dir, 1, 0), expected, 'outside the sample: the engine\'s fingerprint still matches');

    // The next attach: refused, or (reloaded already) the new bytes. Never the old ones.
    const next: Awaited<ReturnType<WeightdClient['attach']>> | Error = await (await connect()).attach(expected).catch((err: Error) => err);
    if (next instanceof Error) assert.is(errorCode(next), 'E_STALE', next.message);
    else {
      assert.is(next.status, 'attached');
      if (next.status === 'attached' && next.backend === 'host') assert.ok(mapped(next.tensors[TENSOR]!.data).equals(after), 'a new attach gets the new bytes');
    }

    const stale = await log.until(/is stale: its checkpoint files changed/);
    assert.match(stale, /"level":40/);
    assert.match(stale, /model \\"one48\\" is stale: its checkpoint files changed since it was loaded \(model\.safetensors: (mtime|ctime) \d+ -> \d+ \((modified|written)\)\)/);
    const status = toStatusView(node.status());
    assert.match(status.models[0]!.stale?.files ?? '', /^model\.safetensors: (mtime|ctime) \d+ -> \d+ \((modified|written)\)$/);
    assert.is(status.models[0]!.stale?.changes[0]?.path, m.file);

    await log.until(/"msg":"model \\"one48\\" was loaded again from its changed checkpoint files, and serves"/);
    const fresh = await (await connect()).attach(expected);
    assert.is(fresh.status, 'attached');
    if (fresh.status !== 'attached' || fresh.backend !== 'host') return;
    assert.ok(mapped(fresh.tensors[TENSOR]!.data).equals(after), 'after the reload: the file\'s bytes now');
    assert.ok(mapped(held.tensors[TENSOR]!.data).equals(before), 'the lease taken before still reads its own bytes');
    assert.ok(events.some((e) => e.event === 'model_stale' && e.model === 'one48' && e.fingerprint === expected.fingerprint && /model\.safetensors: /.test(e.files?.[0] ?? '')), JSON.stringify(events));

    // Letting go frees the stale version: one version, one segment, no lease, no descriptor left.
    await held.detach();
    await fresh.detach();
    await waitUntil('the stale version is released', () => node!.status().models.some((v) => v.own && v.state === 'released'));
    const live = node.status().models.filter((v) => v.state !== 'released');
    assert.equal(live.map((v) => [v.name, v.state, v.leases]), [['one48', 'serving', 0]]);
    assert.is(weightdMemfds().length, 1, 'only the reloaded version\'s segment is open');
    for (const c of clients.splice(0)) c.close();
    await waitUntil('the daemon closed every client connection', () => node!.status().models.every((v) => v.ranks.every((r) => (r.clients ?? 0) === 0)));
    assert.equal(held0(), baselineFds, 'sockets, files and segments as before the change');
  } finally {
    for (const c of clients) c.close();
    delete process.env.WEIGHTD_SERVE_FILES_CHECK_MS;
    await node?.stop();
    assert.equal(weightdMemfds(), [], 'the node frees every segment when it stops');
    removeDir(dir);
  }
});

test.run();
