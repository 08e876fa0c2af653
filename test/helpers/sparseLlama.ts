// A Llama checkpoint of `layers` 32 MiB BF16 tensors (one down_proj a layer) whose bytes are a
// sparse file's zeros but for a 4 KiB mark at each tensor's start and end, distinct per tensor:
// big enough for the host backend to cut its arena into segments (src/checkpoint/arenaSegmentBytes.ts)
// without writing hundreds of MiB, and marked so that a tensor in the wrong place shows.
import { openSync, closeSync, writeSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { writeSafetensors } from '../../src/checkpoint/writeSafetensors.js';
import { randomBytes } from './checkpoints.js';

export const LAYER_BYTES = 4096 * 4096 * 2;
const MARK = 4096;

export async function writeSparseLlama(dir: string, layers: number): Promise<void> {
  const config = { architectures: ['LlamaForCausalLM'], hidden_size: 4096, num_attention_heads: 32, num_key_value_heads: 8, vocab_size: 4096, num_hidden_layers: layers, intermediate_size: 4096, torch_dtype: 'bfloat16', tie_word_embeddings: true };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  const file = join(dir, 'model.safetensors');
  await writeSafetensors(file, Array.from({ length: layers }, (_, i) => ({ name: `model.layers.${i}.mlp.down_proj.weight`, dtype: 'BF16' as const, shape: [4096, 4096] })), { format: 'pt' });
  const { tensors } = await parseSafetensors(file);
  const fd = openSync(file, 'r+');
  try {
    for (const [i, t] of tensors.entries()) {
      writeSync(fd, randomBytes(2 * i + 1, MARK), 0, MARK, t.begin);
      writeSync(fd, randomBytes(2 * i + 2, MARK), 0, MARK, t.end - MARK);
    }
  } finally {
    closeSync(fd);
  }
}
