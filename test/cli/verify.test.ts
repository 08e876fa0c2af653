// `weightd verify` proves what a daemon holds against a checkpoint on disk, tensor by tensor: a
// copy of the daemon's checkpoint with one byte flipped outside the fingerprint's sample (the
// sampled fingerprint cannot see it, and the daemon's own files did not change, so nothing marks
// it stale) is found and the tensor named. The checkpoint is 72 MiB, so that CI stays quick;
// bench/verify-2gb.sh runs the same on 2 GB (bench/RESULTS.md).
import { closeSync, cpSync, mkdirSync, openSync, readFileSync, readSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseCommand } from '../../src/cli/parseArgs.js';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { expectedFingerprint } from '../../src/client/expectedFingerprint.js';
import { makeTempDir, removeDir, writeArchCheckpoint } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { runCli } from '../helpers/runCli.js';
import { startNode } from '../../src/index.js';
import pino from 'pino';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';

/** Flips one byte of `tensor`, `at` bytes past its first interior sample block (docs/spec/fingerprint.md §3). */
async function flipByte(file: string, tensor: string, at: number): Promise<void> {
  const header = await parseSafetensors(file);
  const t = header.tensors.find((x) => x.name === tensor)!;
  const offset = t.begin + 128 + 4096 + at;
  const fd = openSync(file, 'r+');
  try {
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, offset);
    b[0] = b[0]! ^ 0xff;
    writeSync(fd, b, 0, 1, offset);
  } finally {
    closeSync(fd);
  }
}

test('verify finds one byte flipped outside the sample, names the tensor, and exits 1; an equal checkpoint exits 0', async () => {
  const root = makeTempDir('verify');
  const model = join(root, 'model');
  const socketDir = join(root, 'sockets');
  mkdirSync(model);
  // 4 layers of hidden 1024: 72 MiB of bf16 over 2 shards, the largest tensors 8 MiB.
  await writeArchCheckpoint(model, 'LlamaForCausalLM', { hidden: 1024, heads: 16, kvHeads: 4, intermediate: 2048, vocab: 4096, layers: 4 });
  const daemon = await startDaemon({ model, tp: 2, socketDir, readyTimeoutMs: 120_000 });
  try {
    const equal = await runCli(['verify', '--model', model, '-tp', '2', '--weight-cache-socket-dir', socketDir], { timeoutMs: 120_000 });
    assert.is(equal.code, 0, equal.stdout + equal.stderr);
    assert.match(equal.stdout, /verify: all \d+ tensors of .* equal what the daemon on .* holds/);

    const sampled = await expectedFingerprint(model, 2, 0);
    const copy = join(root, 'copy');
    cpSync(model, copy, { recursive: true });
    const victim = 'model.layers.2.mlp.down_proj.weight';
    const index = JSON.parse(readFileSync(join(copy, 'model.safetensors.index.json'), 'utf8')) as { weight_map: Record<string, string> };
    await flipByte(join(copy, index.weight_map[victim]!), victim, 100);
    assert.is((await expectedFingerprint(copy, 2, 0)).fingerprint, sampled.fingerprint, 'the flipped byte is outside the sample');

    const differ = await runCli(['verify', '--model', copy, '-tp', '2', '--weight-cache-socket-dir', socketDir], { timeoutMs: 120_000 });
    assert.is(differ.code, 1, differ.stdout + differ.stderr);
    assert.match(differ.stdout, new RegExp(`verify: tensor ${victim.replaceAll('.', '\\.')} differs: on disk [0-9a-f]{32}, in the daemon [0-9a-f]{32}`));
    assert.match(differ.stdout, /verify: 1 of \d+ tensors differ/);

    // The daemon's own files changed in place: whether its stat check has seen it yet (stale) or
    // not (the digests differ), verify says they differ.
    await flipByte(join(model, index.weight_map[victim]!), victim, 100);
    const edited = await runCli(['verify', '--model', model, '-tp', '2', '--weight-cache-socket-dir', socketDir], { timeoutMs: 120_000 });
    assert.is(edited.code, 1, edited.stdout + edited.stderr);
    assert.match(edited.stdout, new RegExp(`verify: the daemon's copy is stale: .*\\.safetensors|verify: tensor ${victim.replaceAll('.', '\\.')} differs`));
  } finally {
    await daemon.stop();
    removeDir(root);
  }
});

test('verify with no daemon to ask exits 3, saying so', async () => {
  const root = makeTempDir('verify');
  try {
    const r = await runCli(['verify', '--model', join(process.cwd(), 'examples/tiny-llama'), '--weight-cache-socket-dir', join(root, 'none')]);
    assert.is(r.code, 3, r.stdout + r.stderr);
    assert.match(r.stdout, /verify: cannot ask a daemon for rank 0/);
  } finally {
    removeDir(root);
  }
});

test('verify --model names which of several models on one socket to compare: each equals its own files', async () => {
  // A variant has every byte inverted: compared with the socket's first model, all would differ.
  const variant = writeVariant(exampleModel, join(freshTempDir(), 'variant'));
  const socketDir = freshSocketDir();
  const node = await startNode({ model: exampleModel, tensorParallelSize: 2, models: [{ model: variant, tensorParallelSize: 1 }], device: 'host', socketDir, logger: pino({ level: 'silent' }) });
  try {
    await node.ready;
    for (const [model, tp] of [[variant, '1'], [exampleModel, '2']] as const) {
      const r = await runCli(['verify', '--model', model, '-tp', tp, '--weight-cache-socket-dir', socketDir], { timeoutMs: 120_000 });
      assert.is(r.code, 0, r.stdout + r.stderr);
      assert.match(r.stdout, /verify: all \d+ tensors of .* equal what the daemon/);
    }
    const notServed = await runCli(['verify', '--model', variant, '-tp', '2', '--weight-cache-socket-dir', socketDir], { timeoutMs: 120_000 });
    assert.is(notServed.code, 3, notServed.stdout + notServed.stderr);
    assert.match(notServed.stdout, /serves no version of .* with rank 0's fingerprint [0-9a-f]+ .*: nothing to compare with/);
  } finally {
    await node.stop();
    removeDir(variant);
  }
});

test('verify of a directory it cannot plan exits 3 (cannot compare), not 1 (differ), naming the directory', async () => {
  const root = makeTempDir('verify');
  const model = join(root, 'model');
  try {
    cpSync(exampleModel, model, { recursive: true });
    rmSync(join(model, 'config.json'));
    const r = await runCli(['verify', '--model', model, '--weight-cache-socket-dir', join(root, 'none')]);
    assert.is(r.code, 3, r.stdout + r.stderr);
    assert.match(r.stdout, /verify: cannot plan .*\/model at tp 1 \(E_[A-Z_]+\): .*config\.json/);
  } finally {
    removeDir(root);
  }
});

test('verify takes --model, or --name with --version (a written version), never half or both', () => {
  assert.equal(parseCommand(['verify', '--name', 'kv', '--version', '2']), { command: 'verifyWritten', request: { name: 'kv', version: 2, socketDir: undefined, globalRank: undefined } });
  for (const argv of [['verify', '--name', 'kv'], ['verify', '--version', '2'], ['verify', '--model', exampleModel, '--name', 'kv', '--version', '2']]) {
    assert.throws(() => parseCommand(argv), /weightd verify takes --model DIR \(a checkpoint version, against its files\) or --name NAME --version N/, argv.join(' '));
  }
});

test.run();
