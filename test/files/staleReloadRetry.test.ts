// A stale model's reload is retried (issue 29, docs/spec/file-identity.md "A stale version"): a
// model that goes stale while an operator's load runs is loaded again once that load ends, with
// the files' new bytes; and a reload that keeps failing because its files keep changing waits,
// and is given up without a leak, when the daemon stops.
import { mkdirSync } from 'node:fs';
import { BroadcastChannel } from 'node:worker_threads';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { startNode, type WeightdNode } from '../../src/index.js';
import { capturedLog } from '../helpers/capturedLog.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { afterCtimeOf } from '../helpers/fileClock.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel } from '../helpers/paths.js';
import { flipUnsampledByte, tensorBytes, TENSOR, writeSingleTensorModel } from '../helpers/singleTensorModel.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { modelRankWorker } from '../models/fixtures/modelRankWorker.js';

const mapped = (data: ArrayBufferView) => Buffer.from(data.buffer, data.byteOffset, data.byteLength);

/** Attaches once, so that the rank checks its files now; the outcome does not matter. */
async function touch(socketDir: string, dir: string): Promise<void> {
  const client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
  try {
    const a = await client.attach(await expectedFingerprint(dir, 1, 0)).catch(() => undefined);
    if (a?.status === 'attached') await a.detach();
  } finally {
    client.close();
  }
}

/** The first of the reload's outcomes for `name` that the log shows: retried, loaded again, or given up. */
const reloadOutcome = (name: string) =>
  new RegExp(`"msg":"model \\\\"${name}\\\\" (is not loaded again yet|was loaded again|was not loaded again|is not loaded again after)`);

test('a model that goes stale while an operator load runs is loaded again, with the new bytes, once that load ends', async () => {
  const dir = makeTempDir('staleretry');
  process.env.WEIGHTD_SERVE_FILES_CHECK_MS = '0';
  const log = capturedLog();
  const channel = new BroadcastChannel(`staleretry-${process.pid}`);
  let node: WeightdNode | undefined;
  try {
    mkdirSync(`${dir}/a`);
    const a = await writeSingleTensorModel(`${dir}/a`);
    const c = writeVariant(exampleModel, `${dir}/c`);
    const socketDir = `${dir}/s`;
    node = await startNode({ model: a.dir, device: 'host', socketDir, logger: log.logger, progress: false }, { rankWorker: modelRankWorker({ hold: `staleretry-${process.pid}`, onlyFiles: '/c/' }) });
    await node.ready;
    const held = new Promise<void>((resolve) => (channel.onmessage = (e) => (e as MessageEvent).data === 'held' && resolve()));
    const loadingC = node.load({ model: c });
    await held;

    afterCtimeOf(a.file);
    flipUnsampledByte(a);
    await touch(socketDir, a.dir);
    assert.match(await log.until(reloadOutcome('a')), /"code":"E_LOAD_BUSY".*is not loaded again yet \(model \\"c\\" is loading.*once the running load ends/);

    channel.postMessage('go');
    assert.is((await loadingC).name, 'c');
    await log.until(/"msg":"model \\"a\\" was loaded again from its changed checkpoint files, and serves"/);
    const client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
    const fresh = await client.attach(await expectedFingerprint(a.dir, 1, 0));
    assert.is(fresh.status, 'attached');
    if (fresh.status === 'attached' && fresh.backend === 'host') assert.ok(mapped(fresh.tensors[TENSOR]!.data).equals(tensorBytes(a)), 'the reload serves the new bytes');
    if (fresh.status === 'attached') await fresh.detach();
    client.close();
  } finally {
    channel.close();
    delete process.env.WEIGHTD_SERVE_FILES_CHECK_MS;
    await node?.stop();
    assert.equal(weightdMemfds(), [], 'the node frees every segment when it stops');
    removeDir(dir);
  }
});

test('a reload whose files keep changing is retried after a backoff, and given up when the node stops: nothing is left', async () => {
  const dir = makeTempDir('staleretry');
  process.env.WEIGHTD_SERVE_FILES_CHECK_MS = '0';
  const log = capturedLog();
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  let node: WeightdNode | undefined;
  try {
    mkdirSync(`${dir}/a`);
    const a = await writeSingleTensorModel(`${dir}/a`);
    const socketDir = `${dir}/s`;
    // The own model loads as usual; each reload's rank grows the file, as a copy still being written would.
    node = await startNode({ model: a.dir, device: 'host', socketDir, logger: log.logger, progress: false }, { rankWorker: modelRankWorker({ growFile: true, onlyFiles: '/a/' }) });
    await node.ready;
    afterCtimeOf(a.file);
    flipUnsampledByte(a);
    await touch(socketDir, a.dir);
    assert.match(await log.until(reloadOutcome('a')), /is not loaded again yet .*trying again in 1000 ms/);

    // The retry's timer is pending now. Others may be too (an earlier test's, ending at any
    // moment under load): the count can only be compared across the stop, and only downwards.
    const pending = timers();
    const stopped = node.stop();
    node = undefined;
    await stopped;
    assert.ok(timers() < pending, `the retry's timer is cleared when the node stops (${pending} pending before, ${timers()} after)`);
    // Given up by the stop itself, not by the timer a second later.
    assert.ok(log.lines.some((l) => /"msg":"model \\"a\\" is not loaded again after its checkpoint files changed: the node stops"/.test(l)), 'the reload gave up as the node stopped');
  } finally {
    delete process.env.WEIGHTD_SERVE_FILES_CHECK_MS;
    await node?.stop();
    assert.equal(weightdMemfds(), [], 'the node frees every segment when it stops');
    removeDir(dir);
  }
});

test.run();
