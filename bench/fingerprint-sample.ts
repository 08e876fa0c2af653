// Cost of the `content` fingerprint field on a big checkpoint with a warm page cache: the
// daemon's sampling (sampleShards in a piscina pool) and the engine's whole
// expected_fingerprint in Python (weightd_client). Prints one JSON line.
//
//   node dist/bench/fingerprint-sample.js --gb 100 --tensors 723 --files 30            (sparse files)
//   node dist/bench/fingerprint-sample.js --gb 3 --tensors 300 --files 1 --real        (random bytes on disk)
//   [--python PATH] [--runs 5] [--dir DIR (kept, reused when it exists)]
//
// Sparse files hold real headers over holes: reading a hole copies zero pages out of the page
// cache, which costs what reading cached data costs, so it stands in for a 100 GB checkpoint on
// a machine without 100 GB of disk. --real writes random bytes instead.

import { spawnSync } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { sha256Hex } from '../src/checkpoint/fingerprint.js';
import { createHeaderPool, parseShards, sampleShards } from '../src/checkpoint/parseShards.js';
import { sampleRanges } from '../src/checkpoint/sampleContent.js';
import { encodeSafetensorsHeader, writeSafetensors, type TensorToWrite } from '../src/checkpoint/writeSafetensors.js';

const { values } = parseArgs({
  options: {
    gb: { type: 'string', default: '100' },
    tensors: { type: 'string', default: '723' },
    files: { type: 'string', default: '30' },
    real: { type: 'boolean', default: false },
    runs: { type: 'string', default: '5' },
    python: { type: 'string', default: process.env.PYTHON ?? 'python3' },
    dir: { type: 'string' },
  },
});
const GB = Number(values.gb), TENSORS = Number(values.tensors), FILES = Number(values.files), RUNS = Number(values.runs);

async function writeReal(path: string, tensors: TensorToWrite[]): Promise<void> {
  const { header, dataBytes } = encodeSafetensorsHeader(tensors);
  const fh = await open(path, 'w');
  try {
    await fh.write(header, 0, header.length, 0);
    const chunk = Buffer.allocUnsafe(64 << 20);
    for (let done = 0; done < dataBytes; done += chunk.length) {
      const n = Math.min(chunk.length, dataBytes - done);
      randomFillSync(chunk, 0, n);
      await fh.write(chunk, 0, n, header.length + done);
    }
  } finally {
    await fh.close();
  }
}

/** Writes the checkpoint; returns its files, as the index lists them. */
async function makeCheckpoint(dir: string): Promise<string[]> {
  // Equal tensors of BF16 elements: the sample depends on sizes and count, not on names.
  const elements = Math.floor((GB * 1e9) / TENSORS / 2);
  const all: TensorToWrite[] = Array.from({ length: TENSORS }, (_, i) => ({ name: `model.t${i}.weight`, dtype: 'BF16', shape: [elements] }));
  const weightMap: Record<string, string> = {};
  const per = Math.ceil(all.length / FILES);
  const count = Math.ceil(all.length / per);
  for (let f = 0; f < count; f++) {
    const file = `model-${String(f + 1).padStart(5, '0')}-of-${String(count).padStart(5, '0')}.safetensors`;
    const part = all.slice(f * per, (f + 1) * per);
    await (values.real ? writeReal : writeSafetensors)(join(dir, file), part);
    for (const t of part) weightMap[t.name] = file;
  }
  writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: weightMap }));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ architectures: ['LlamaForCausalLM'], num_attention_heads: 8, hidden_size: 1024, torch_dtype: 'bfloat16' }));
  return [...new Set(Object.values(weightMap))].sort();
}

const PY = `
import json, sys, time
from weightd_client.fingerprint import expected_fingerprint
runs = []
for _ in range(int(sys.argv[2]) + 1):
    t = time.perf_counter(); e = expected_fingerprint(sys.argv[1], 1, 0); runs.append((time.perf_counter() - t) * 1000)
print(json.dumps({"content": e.fields["content"], "runsMs": [round(r, 1) for r in runs[1:]]}))
`;

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const keep = values.dir !== undefined;
const dir = values.dir ?? mkdtempSync(join(tmpdir(), 'weightd-bench-fp-'));
try {
  const index = join(dir, 'model.safetensors.index.json');
  if (!existsSync(index)) mkdirSync(dir, { recursive: true });
  const names = existsSync(index)
    ? [...new Set(Object.values((JSON.parse(readFileSync(index, 'utf8')) as { weight_map: Record<string, string> }).weight_map))].sort()
    : await makeCheckpoint(dir);
  const files = names.map((n) => join(dir, n));
  const pool = createHeaderPool();
  try {
    const headers = await parseShards(files, pool);
    const total = headers.reduce((s, h) => s + h.tensors.reduce((a, t) => a + t.end - t.begin, 0), 0);
    let ranges = 0, sampled = 0, before = 0;
    for (const h of headers) {
      const r = sampleRanges(h.tensors.flatMap((t) => [t.begin, t.end]), total, before);
      before += h.tensors.reduce((a, t) => a + t.end - t.begin, 0);
      ranges += r.length / 2;
      for (let i = 0; i < r.length; i += 2) sampled += r[i + 1]! - r[i]!;
    }
    const digests = await sampleShards(headers, pool); // warms the cache and the pool's threads
    const ms: number[] = [];
    for (let r = 0; r < RUNS; r++) {
      const started = performance.now();
      await sampleShards(headers, pool);
      ms.push(Math.round((performance.now() - started) * 10) / 10);
    }
    const py = spawnSync(values.python, ['-c', PY, dir, String(RUNS)], {
      env: { ...process.env, PYTHONPATH: join(process.cwd(), 'clients/python') }, encoding: 'utf8',
    });
    if (py.status !== 0) throw new Error(`python failed: ${py.stderr}`);
    const python = JSON.parse(py.stdout) as { content: string; runsMs: number[] };
    console.log(JSON.stringify({
      bench: 'fingerprint-sample',
      data: values.real ? 'random bytes on disk' : 'sparse files (holes)',
      dataBytes: total,
      tensors: TENSORS,
      files: files.length,
      sampledRanges: ranges,
      sampledBytes: sampled,
      daemonSampleMs: { median: median(ms), runs: ms, poolThreads: pool.options.maxThreads },
      pythonExpectedFingerprintMs: { median: median(python.runsMs), runs: python.runsMs },
      pythonContentAgrees: python.content === sha256Hex(digests.join('\n')),
      machine: `${availableParallelism()} cores (${cpus()[0]?.model.trim() ?? 'unknown cpu'}), node ${process.versions.node}`,
    }));
  } finally {
    await pool.destroy();
  }
} finally {
  if (!keep) rmSync(dir, { recursive: true, force: true });
}
