// The clients against a cuda daemon on real GPUs (skipped where CUDA is unavailable): every
// tensor read back through the TypeScript client (copy) and the Python client (zero-copy and
// copy; torch tensors where torch is installed) equals the checkpoint slice, for every rank of
// tp = number of GPUs (up to 2), with legacy IPC handles and with --cuda-handles fd; a client on
// the wrong GPU is refused; no lease is left.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { DeviceError } from '../../src/errors.js';
import { cudaProbe } from '../../src/native/cuda.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { runClient, type ClientLanguage } from './runClient.js';

const probe = await cudaProbe();
const TP = Math.min(2, probe.devices.length);

interface Described {
  sha256: string;
  shape: number[];
  ctor?: string;
  device?: string;
}

// Both kinds of handle: legacy IPC (the default) and --cuda-handles fd (VMM memory whose
// descriptors come over the socket, get_segment_fds).
for (const handles of ['ipc', 'fd'] as const) test(`cuda tp=${TP}: clients read exactly the checkpoint slices through ${handles} handles`, async () => {
  if (!probe.available) {
    console.log(`  (no GPU here: ${probe.reason})`);
    return;
  }
  const dir = makeTempDir('cuda');
  const daemon = await startDaemon({ model: exampleModel, tp: TP, device: 'cuda', socketDir: dir, readyTimeoutMs: 120_000, extraArgs: ['--cuda-handles', handles] });
  try {
    for (let rank = 0; rank < TP; rank++) {
      const socket = await findSocket({ socketDir: dir, globalRank: rank });
      const fingerprint = await expectedFingerprint(exampleModel, TP, rank);
      const expected = expectedRank(exampleModel, TP, rank);
      // Local rank r runs on visible GPU r; Python attaches to that ordinal.
      const env = { WEIGHTD_TEST_CUDA_DEVICE: String(rank) };
      // python-memoryview: the torch-free path (__cuda_array_interface__ objects, driver copies).
      const runs: Array<[ClientLanguage, string]> = [['ts', 'copy'], ['python', 'map'], ['python', 'copy'], ['python-memoryview', 'map'], ['python-memoryview', 'copy']];
      for (const [lang, mode] of runs) {
        const got = await runClient<{ tensors: Record<string, Described> }>(lang, 'hashes', socket, fingerprint, mode, env);
        for (const [name, want] of expected) {
          const t = got.tensors[name];
          assert.is(t?.sha256, want.sha256, `${lang} ${mode} rank ${rank}: ${name}`);
          assert.equal(t!.shape, want.shape, `${lang} ${mode} rank ${rank}: shape of ${name}`);
          if (t!.ctor?.startsWith('torch.')) {
            assert.is(t!.ctor, 'torch.bfloat16', `${name} is a real bf16 tensor`);
            assert.is(t!.device, `cuda:${rank}`, `${name} lives on the rank's GPU`);
          }
        }
      }
      const torch = await runClient<{ params: number; zeroCopy: boolean; device: string }>('python', 'load_state_dict', socket, fingerprint, undefined, env).catch(
        (err: Error) => (/No module named 'torch'/.test(err.message) ? undefined : Promise.reject(err)),
      );
      if (torch) assert.equal(torch, { params: expected.size, zeroCopy: true, device: `cuda:${rank}` }, 'load_state_dict(assign=True) keeps the daemon memory');
      const mapped = await runClient<{ tensors: Record<string, { pointer: string }> }>('ts', 'hashes', socket, fingerprint, 'map');
      assert.is(new Set(Object.values(mapped.tensors).map((t) => t.pointer)).size, expected.size, 'one device pointer per tensor');

      const client = await WeightdClient.connect(socket);
      if (TP > 1) {
        // This process's GPU (TP - 1 - rank) is not the daemon's for this rank: refused.
        const wrong = TP - 1 - rank;
        const err = await client.attach(fingerprint, { deviceIndex: wrong }).then(() => undefined, (e: unknown) => e);
        assert.instance(err, DeviceError);
        assert.is((err as DeviceError).code, 'E_DEVICE_MISMATCH');
      }
      assert.equal((await client.stats()).leases, [], 'no lease left, also after a refused attach');
      assert.is((await client.ping()).device.backend, 'cuda');
      const state = await client.getState(fingerprint, 'copy');
      if (state.status === 'ok') {
        assert.ok(state.segments.every((seg) => (seg.handle === 'cuda-fd') === (handles === 'fd')), `${handles}: ${state.segments.map((seg) => seg.handle).join(',')}`);
        await client.detach(state.leaseId);
      }
      client.close();
    }
  } finally {
    await daemon.stop();
    removeDir(dir);
  }
});

test.run();
