// The vllm layout's views, for every architecture it knows, at tp 1, 2 and 4 and with vocab
// sizes that are not multiples of 64: the names vLLM's named_parameters() gives, shapes after
// its weight loaders ran, and bytes equal to the member pieces cut element by element from the
// original tensors (expectedPiece) stacked in vLLM's order, vocab padding rows zero. The
// checkpoint views of the same plan still hold their own pieces.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { CheckpointPlan, RankPlan, TensorView } from '../../src/checkpoint/types.js';
import { ShardingError } from '../../src/errors.js';
import { architectureTensors, executePlan, expectedPiece, fixtureTensor, makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeCheckpoint, type FixtureTensor } from '../helpers/checkpoints.js';

const ARCHS = ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', 'Gemma2ForCausalLM', 'Phi3ForCausalLM', 'MixtralForCausalLM', 'Qwen3MoeForCausalLM'];
// Small hidden sizes keep a 50257-row embedding at 1.6 MB; 2 KV heads are replicated at tp 4.
const SHAPE = { hidden: 16, heads: 4, kvHeads: 2, headDim: 4, intermediate: 32, layers: 2, experts: 2 };
const ELT = 2;

/** vLLM's parameters of one layer and the checkpoint tensors each stacks, in order. */
function engineParams(arch: string, layers: number, experts: number, tied: boolean): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const one = (name: string): void => void out.set(name, [name]);
  one('model.embed_tokens.weight');
  if (!tied) one('lm_head.weight');
  one('model.norm.weight');
  for (let l = 0; l < layers; l++) {
    const p = `model.layers.${l}`;
    one(`${p}.input_layernorm.weight`);
    one(`${p}.post_attention_layernorm.weight`);
    one(`${p}.self_attn.o_proj.weight`);
    if (arch === 'Phi3ForCausalLM') {
      one(`${p}.self_attn.qkv_proj.weight`);
      one(`${p}.mlp.gate_up_proj.weight`);
      one(`${p}.mlp.down_proj.weight`);
      continue;
    }
    out.set(`${p}.self_attn.qkv_proj.weight`, ['q', 'k', 'v'].map((x) => `${p}.self_attn.${x}_proj.weight`));
    if (arch === 'Qwen2ForCausalLM') out.set(`${p}.self_attn.qkv_proj.bias`, ['q', 'k', 'v'].map((x) => `${p}.self_attn.${x}_proj.bias`));
    if (arch.startsWith('Qwen3')) {
      one(`${p}.self_attn.q_norm.weight`);
      one(`${p}.self_attn.k_norm.weight`);
    }
    if (arch === 'Gemma2ForCausalLM') {
      one(`${p}.pre_feedforward_layernorm.weight`);
      one(`${p}.post_feedforward_layernorm.weight`);
    }
    const range = [...Array(experts).keys()];
    if (arch === 'MixtralForCausalLM') {
      const b = `${p}.block_sparse_moe`;
      one(`${b}.gate.weight`);
      out.set(`${b}.experts.w13_weight`, range.flatMap((e) => [`${b}.experts.${e}.w1.weight`, `${b}.experts.${e}.w3.weight`]));
      out.set(`${b}.experts.w2_weight`, range.map((e) => `${b}.experts.${e}.w2.weight`));
    } else if (arch === 'Qwen3MoeForCausalLM') {
      const b = `${p}.mlp`;
      one(`${b}.gate.weight`);
      out.set(`${b}.experts.w13_weight`, range.flatMap((e) => [`${b}.experts.${e}.gate_proj.weight`, `${b}.experts.${e}.up_proj.weight`]));
      out.set(`${b}.experts.w2_weight`, range.map((e) => `${b}.experts.${e}.down_proj.weight`));
    } else {
      out.set(`${p}.mlp.gate_up_proj.weight`, [`${p}.mlp.gate_proj.weight`, `${p}.mlp.up_proj.weight`]);
      one(`${p}.mlp.down_proj.weight`);
    }
  }
  return out;
}

/** vLLM's VocabParallelEmbedding shard: pad to 64, divide, real rows first, zeros after. */
function vocabPiece(t: FixtureTensor, tp: number, rank: number): { shape: number[]; data: Buffer } {
  const [rows, cols] = t.shape as [number, number];
  const per = Math.ceil(rows / 64) * 64 / tp;
  const start = Math.min(rank * per, rows);
  const end = Math.min((rank + 1) * per, rows);
  const data = Buffer.alloc(per * cols * ELT);
  Buffer.from(t.data.subarray(start * cols * ELT, end * cols * ELT)).copy(data);
  return { shape: [per, cols], data };
}

function expectedView(name: string, members: FixtureTensor[], tp: number, rank: number, experts: number): { shape: number[]; data: Buffer } {
  const isVocab = name === 'model.embed_tokens.weight' || name === 'lm_head.weight';
  const pieces = members.map((m) => (isVocab ? vocabPiece(m, tp, rank) : expectedPiece(m, tp, rank)));
  const data = Buffer.concat(pieces.map((p) => p.data));
  if (pieces.length === 1 && !name.includes('experts')) return { shape: pieces[0]!.shape, data };
  const rows = pieces.reduce((a, p) => a + p.shape[0]!, 0);
  const trailing = pieces[0]!.shape.slice(1);
  return { shape: name.includes('.experts.') ? [experts, rows / experts, ...trailing] : [rows, ...trailing], data };
}

function viewBytes(arena: Buffer, v: { offset: number; bytes: number }): Buffer {
  return arena.subarray(v.offset, v.offset + v.bytes);
}

for (const arch of ARCHS) {
  for (const vocab of [32016, 50257]) {
    test(`${arch}, vocab ${vocab}: vllm views at tp 1, 2, 4`, async () => {
      const dir = makeTempDir('vllm-layout');
      try {
        const tensors = await writeArchCheckpoint(dir, arch, { ...SHAPE, vocab });
        const byName = new Map(tensors.map((t) => [t.name, t]));
        const tied = arch === 'Gemma2ForCausalLM';
        const params = engineParams(arch, SHAPE.layers, SHAPE.experts, tied);
        for (const tp of [1, 2, 4]) {
          const plan = await planCheckpoint(dir, { tpSize: tp, layouts: ['vllm'] });
          assert.equal(plan.layouts, ['checkpoint', 'vllm']);
          for (const rank of plan.ranks) {
            const views = rank.layouts.vllm!.tensors;
            assert.equal(views.map((v) => v.name).sort(), [...params.keys()].sort(), `tp ${tp} rank ${rank.tpRank}: names`);
            assert.equal(rank.layouts.vllm!.aliases, {}, 'vLLM dedups a tied lm_head: it has no name of its own');
            const [arena] = await executePlan(rank);
            for (const v of views) {
              const want = expectedView(v.name, params.get(v.name)!.map((m) => byName.get(m)!), tp, rank.tpRank, SHAPE.experts);
              const where = `${v.name} at tp ${tp} rank ${rank.tpRank}`;
              assert.equal(v.shape, want.shape, `${where}: shape`);
              assert.is(v.dtype, byName.get(params.get(v.name)![0]!)!.dtype, `${where}: dtype`);
              assert.is(v.bytes, want.data.length, `${where}: bytes`);
              assert.ok(viewBytes(arena!, v).equals(want.data), `${where}: content`);
            }
            for (const t of rank.tensors) {
              const want = t.name.includes('embed_tokens') || t.name === 'lm_head.weight' ? null : expectedPiece(byName.get(t.name)!, tp, rank.tpRank);
              if (want) assert.ok(viewBytes(arena!, t).equals(want.data), `checkpoint view ${t.name} at tp ${tp} rank ${rank.tpRank}`);
            }
            assertZeroRangesUnwritten(rank);
          }
        }
      } finally {
        removeDir(dir);
      }
    });
  }
}

/** Padding is never a copy op's destination, and lies inside its vocab view. */
function assertZeroRangesUnwritten(rank: RankPlan): void {
  for (const z of rank.zeroRanges) {
    for (const op of rank.ops) {
      const end = op.dstOffset + op.rows * op.rowBytes;
      assert.ok(end <= z.offset || op.dstOffset >= z.offset + z.bytes, `an op writes padding at ${z.offset}`);
    }
    const inside = (v: TensorView): boolean => v.offset <= z.offset && z.offset + z.bytes <= v.offset + v.bytes;
    assert.ok(rank.layouts.vllm!.tensors.some((v) => inside(v) && /embed_tokens|lm_head/.test(v.name)), 'padding belongs to a vocab view');
  }
}

// Block-FP8 (DeepSeek-style, 128 x 128 blocks): each linear weight's weight_scale_inv stacks
// like the weight into the parameter's weight_scale_inv. Sizes keep every partition whole
// blocks at tp 4 (vLLM refuses others), with 2 KV heads of 128 replicated over pairs of ranks.
const FP8 = { hidden: 512, heads: 4, kvHeads: 2, headDim: 128, intermediate: 512, layers: 1, experts: 2, vocab: 1000 };
const BLOCK = 128;

function blockFp8(arch: string, dims = FP8): FixtureTensor[] {
  const out: FixtureTensor[] = [];
  for (const t of architectureTensors(arch, dims)) {
    const linear = t.shape.length === 2 && /(_proj|\.w[123])\.weight$/.test(t.name);
    if (!linear) {
      out.push(t);
      continue;
    }
    out.push(fixtureTensor(t.name, t.shape, t.expect, 'F8_E4M3'));
    const scaleShape = t.shape.map((d) => Math.ceil(d / BLOCK));
    const e = t.expect;
    const scaleExpect = e === 'full' ? e : { dim: e.dim, parts: e.parts?.map((p) => ({ size: p.size / BLOCK, kvHeads: p.kvHeads })) };
    out.push(fixtureTensor(t.name.replace(/\.weight$/, '.weight_scale_inv'), scaleShape, scaleExpect, 'F32'));
  }
  return out;
}

/** Plans `tensors` at each tp size and checks every vllm view against vLLM's stacking of its members. */
async function checkEngineViews(dir: string, tensors: FixtureTensor[], params: Map<string, string[]>, experts: number, tps: number[]): Promise<void> {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  for (const tp of tps) {
    const plan = await planCheckpoint(dir, { tpSize: tp, layouts: ['vllm'] });
    assert.equal(plan.refusedLayouts, {}, `tp ${tp}`);
    for (const rank of plan.ranks) {
      const views = rank.layouts.vllm!.tensors;
      assert.equal(views.map((v) => v.name).sort(), [...params.keys()].sort(), `tp ${tp}: names`);
      const [arena] = await executePlan(rank);
      for (const v of views) {
        if (/embed_tokens|lm_head/.test(v.name)) continue;
        const members = params.get(v.name)!.map((m) => byName.get(m)!);
        const want = /(weight|input)_scale$/.test(v.name) ? scalarView(v.name, members, experts) : expectedView(v.name, members, tp, rank.tpRank, experts);
        assert.equal(v.shape, want.shape, `${v.name} at tp ${tp} rank ${rank.tpRank}: shape`);
        assert.is(v.dtype, members[0]!.dtype);
        assert.ok(viewBytes(arena!, v).equals(want.data), `${v.name} at tp ${tp} rank ${rank.tpRank}: content`);
      }
    }
  }
}

/** vLLM's PerTensorScaleParameter: [pieces], FusedMoE's [experts, 2] and [experts]; every rank holds every scalar. */
function scalarView(name: string, members: FixtureTensor[], experts: number): { shape: number[]; data: Buffer } {
  const data = Buffer.concat(members.map((m) => Buffer.from(m.data)));
  if (!name.includes('.experts.')) return { shape: [members.length], data };
  return { shape: members.length === experts ? [experts] : [experts, members.length / experts], data };
}

/** The engine parameters of `arch` plus, for each quantized linear, its scale parameters. */
function quantizedParams(arch: string, tensors: FixtureTensor[], dims: { layers: number; experts: number }, suffixes: string[]): Map<string, string[]> {
  const names = new Set(tensors.map((t) => t.name));
  const params = engineParams(arch, dims.layers, dims.experts, false);
  for (const [name, members] of [...params]) {
    for (const suffix of suffixes) {
      const scales = members.map((m) => m.replace(/\.weight$/, `.${suffix}`));
      if (!names.has(scales[0]!)) continue;
      params.set(suffix === 'input_scale' ? name.replace(/weight$/, suffix) : `${name}${suffix.slice('weight'.length)}`, scales);
    }
  }
  return params;
}

for (const arch of ['LlamaForCausalLM', 'Qwen3ForCausalLM', 'MixtralForCausalLM', 'Qwen3MoeForCausalLM']) {
  test(`${arch}, block-FP8: weights and weight_scale_inv stack alike at tp 1, 2, 4`, async () => {
    const dir = makeTempDir('vllm-fp8');
    try {
      const tensors = blockFp8(arch);
      await writeCheckpoint(dir, fp8Config(arch), tensors, 2);
      await checkEngineViews(dir, tensors, quantizedParams(arch, tensors, FP8, ['weight_scale_inv']), FP8.experts, [1, 2, 4]);
    } finally {
      removeDir(dir);
    }
  });
}

test('block-FP8 at head_dim 64: planned wherever no rank cuts a block (tp 1, 2), refused alone at tp 4', async () => {
  const dir = makeTempDir('vllm-fp8-hd64');
  try {
    // 4 KV heads of 64: k_proj [256, 512], its scales [2, 4]; at tp 4 a rank holds half a block.
    const dims = { ...FP8, heads: 8, kvHeads: 4, headDim: 64 };
    const tensors = blockFp8('LlamaForCausalLM', dims);
    await writeCheckpoint(dir, { ...fp8Config('LlamaForCausalLM'), num_attention_heads: 8, num_key_value_heads: 4, head_dim: 64 }, tensors, 1);
    await checkEngineViews(dir, tensors, quantizedParams('LlamaForCausalLM', tensors, dims, ['weight_scale_inv']), dims.experts, [1, 2]);
    const plan = await planCheckpoint(dir, { tpSize: 4, layouts: ['vllm'] });
    assert.equal(plan.layouts, ['checkpoint']);
    assert.is(plan.refusedLayouts.vllm?.code, 'E_LAYOUT_SCALE_BLOCKS');
    assert.match(plan.refusedLayouts.vllm!.message, 'model.layers.0.self_attn.k_proj.weight_scale_inv');
    assert.equal(plan.ranks[3]!.layouts, {});
  } finally {
    removeDir(dir);
  }
});

/** Per-tensor FP8: F8_E4M3 linear weights, each with an F32 scalar weight_scale (and input_scale when `inputScales`). */
function perTensorFp8(arch: string, inputScales: boolean): FixtureTensor[] {
  const out: FixtureTensor[] = [];
  for (const t of architectureTensors(arch, FP8)) {
    if (!(t.shape.length === 2 && /(_proj|\.w[123])\.weight$/.test(t.name))) {
      out.push(t);
      continue;
    }
    out.push(fixtureTensor(t.name, t.shape, t.expect, 'F8_E4M3'));
    out.push(fixtureTensor(t.name.replace(/\.weight$/, '.weight_scale'), [], 'full', 'F32'));
    if (inputScales) out.push(fixtureTensor(t.name.replace(/\.weight$/, '.input_scale'), [], 'full', 'F32'));
  }
  return out;
}

for (const arch of ['LlamaForCausalLM', 'Qwen3MoeForCausalLM']) {
  test(`${arch}, per-tensor FP8: one scale per fused piece, as vLLM's PerTensorScaleParameter holds them, at tp 1, 2, 4`, async () => {
    const dir = makeTempDir('vllm-fp8-tensor');
    try {
      const tensors = perTensorFp8(arch, false);
      const config = { ...fp8Config(arch), quantization_config: { quant_method: 'fp8', activation_scheme: 'dynamic' } };
      await writeCheckpoint(dir, config, tensors, 2);
      await checkEngineViews(dir, tensors, quantizedParams(arch, tensors, FP8, ['weight_scale']), FP8.experts, [1, 2, 4]);
    } finally {
      removeDir(dir);
    }
  });
}

test('per-tensor FP8 with static input scales: stacked per piece on linear layers; FusedMoE keeps one per expert for w1 and w3, so the layout is refused alone', async () => {
  const dir = makeTempDir('vllm-fp8-static');
  try {
    const config = { ...fp8Config('LlamaForCausalLM'), quantization_config: { quant_method: 'fp8', activation_scheme: 'static' } };
    const tensors = perTensorFp8('LlamaForCausalLM', true);
    await writeCheckpoint(dir, config, tensors, 1);
    await checkEngineViews(dir, tensors, quantizedParams('LlamaForCausalLM', tensors, FP8, ['weight_scale', 'input_scale']), FP8.experts, [1, 2]);
    await writeCheckpoint(dir, { ...config, architectures: ['Qwen3MoeForCausalLM'] }, perTensorFp8('Qwen3MoeForCausalLM', true), 1);
    const plan = await planCheckpoint(dir, { tpSize: 1, layouts: ['vllm'] });
    assert.equal(plan.layouts, ['checkpoint']);
    assert.is(plan.refusedLayouts.vllm?.code, 'E_LAYOUT_UNKNOWN_TENSOR');
    assert.match(plan.refusedLayouts.vllm!.message, 'model.layers.0.mlp.experts.0.gate_proj.input_scale');
  } finally {
    removeDir(dir);
  }
});

const fp8Config = (arch: string): Record<string, unknown> => ({
  architectures: [arch], hidden_size: FP8.hidden, num_attention_heads: FP8.heads, num_key_value_heads: FP8.kvHeads, head_dim: FP8.headDim, tie_word_embeddings: false,
  quantization_config: { quant_method: 'fp8', weight_block_size: [BLOCK, BLOCK], activation_scheme: 'dynamic' },
});

test('block-FP8: a partition that cuts scale blocks is refused naming the scale, not replicated', async () => {
  const dir = makeTempDir('vllm-fp8-cut');
  try {
    // 256 intermediate rows at tp 4: 64 rows a rank, half a block.
    await writeCheckpoint(dir, fp8Config('LlamaForCausalLM'), blockFp8('LlamaForCausalLM', { ...FP8, intermediate: 256 }), 1);
    assert.equal((await planCheckpoint(dir, { tpSize: 2, layouts: ['vllm'] })).layouts, ['checkpoint', 'vllm']);
    assertRefused(await planCheckpoint(dir, { tpSize: 4, layouts: ['vllm'] }), 'E_LAYOUT_SCALE_BLOCKS', 'model.layers.0.mlp.gate_up_proj.weight_scale_inv', 'model.layers.0.mlp.gate_proj.weight_scale_inv', 'tp size 4');
  } finally {
    removeDir(dir);
  }
});

test('vocab 32016 at tp 4: 8016-row parts, the last rank 7968 real rows and 48 zero rows', async () => {
  const dir = makeTempDir('vllm-vocab');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { ...SHAPE, vocab: 32016, layers: 1 });
    const plan = await planCheckpoint(dir, { tpSize: 4, layouts: ['vllm'] });
    const embed = (r: RankPlan): [number[], number[]] => [r.tensors.find((t) => t.name === 'model.embed_tokens.weight')!.shape, r.layouts.vllm!.tensors.find((t) => t.name === 'model.embed_tokens.weight')!.shape];
    assert.equal(plan.ranks.map(embed), [[[8016, 16], [8016, 16]], [[8016, 16], [8016, 16]], [[8016, 16], [8016, 16]], [[7968, 16], [8016, 16]]]);
    // Without the vllm layout the checkpoint views are the same rows, with no padding in the arena.
    const plain = await planCheckpoint(dir, { tpSize: 4 });
    assert.equal(plain.ranks[3]!.tensors.find((t) => t.name === 'model.embed_tokens.weight')!.shape, [7968, 16]);
    assert.equal(plain.ranks[3]!.zeroRanges, []);
    assert.equal(plain.ranks[3]!.layouts, {});
    assert.is(plan.fingerprint, plain.fingerprint, 'layouts are views: the shard is the same');
  } finally {
    removeDir(dir);
  }
});

test('a fused parameter is one dense block: its checkpoint pieces follow each other', async () => {
  const dir = makeTempDir('vllm-dense');
  try {
    await writeArchCheckpoint(dir, 'Qwen2ForCausalLM', { ...SHAPE, layers: 1, vocab: 256 });
    const plan = await planCheckpoint(dir, { tpSize: 2, layouts: ['vllm'] });
    const rank = plan.ranks[1]!;
    const at = (n: string): { offset: number; bytes: number } => rank.tensors.find((t) => t.name === n)!;
    const qkv = rank.layouts.vllm!.tensors.find((t) => t.name === 'model.layers.0.self_attn.qkv_proj.weight')!;
    const [q, k, v] = ['q', 'k', 'v'].map((x) => at(`model.layers.0.self_attn.${x}_proj.weight`)) as [{ offset: number; bytes: number }, { offset: number; bytes: number }, { offset: number; bytes: number }];
    assert.is(q.offset, qkv.offset);
    assert.is(k.offset, q.offset + q.bytes);
    assert.is(v.offset, k.offset + k.bytes);
    assert.is(qkv.bytes, q.bytes + k.bytes + v.bytes);
    assert.is(qkv.offset % 256, 0, 'the engine parameter itself stays aligned');
  } finally {
    removeDir(dir);
  }
});

/** The vllm layout refused alone, for `code`, naming each of `mentions`: the checkpoint layout is planned and served. */
function assertRefused(plan: CheckpointPlan, code: string, ...mentions: string[]): void {
  assert.equal(plan.layouts, ['checkpoint']);
  assert.is(plan.refusedLayouts.vllm?.code, code);
  for (const m of mentions) assert.match(plan.refusedLayouts.vllm!.message, m);
  for (const rank of plan.ranks) {
    assert.equal(rank.layouts, {});
    assert.ok(rank.tensors.length > 0);
  }
}

test('an engine layout the checkpoint cannot have (an architecture or a tensor it does not know, a fused parameter missing a part) is refused alone; an unknown layout name is an error', async () => {
  const dir = makeTempDir('vllm-errors');
  try {
    await writeArchCheckpoint(dir, 'Qwen2MoeForCausalLM', { ...SHAPE, layers: 1, vocab: 256 });
    assertRefused(await planCheckpoint(dir, { tpSize: 1, layouts: ['vllm'] }), 'E_LAYOUT_ARCHITECTURE', 'Qwen2MoeForCausalLM', 'LlamaForCausalLM');
  } finally {
    removeDir(dir);
  }
  const dir2 = makeTempDir('vllm-errors');
  try {
    // A Llama checkpoint with a tensor vLLM's Llama has no parameter for, then one without v_proj.
    const base = architectureTensors('LlamaForCausalLM', { ...SHAPE, layers: 1, vocab: 256 });
    const config = { architectures: ['LlamaForCausalLM'], hidden_size: 16, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 4 };
    await writeCheckpoint(dir2, config, [...base, fixtureTensor('model.layers.0.self_attn.extra_norm.weight', [16], 'full')], 1);
    assertRefused(await planCheckpoint(dir2, { tpSize: 1, layouts: ['vllm'] }), 'E_LAYOUT_UNKNOWN_TENSOR', 'model.layers.0.self_attn.extra_norm.weight', 'LlamaForCausalLM');
    await writeCheckpoint(dir2, config, base.filter((t) => t.name !== 'model.layers.0.self_attn.v_proj.weight'), 1);
    assertRefused(await planCheckpoint(dir2, { tpSize: 1, layouts: ['vllm'] }), 'E_LAYOUT_INCOMPLETE', 'model.layers.0.self_attn.qkv_proj.weight', 'model.layers.0.self_attn.k_proj.weight');
    await rejectsWith(() => planCheckpoint(dir2, { tpSize: 1, layouts: ['sglang' as 'vllm'] }), ShardingError, 'E_LAYOUT_UNKNOWN', '"sglang"', 'checkpoint, vllm');
  } finally {
    removeDir(dir2);
  }
});

test.run();
