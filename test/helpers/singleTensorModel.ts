// The issue-29 checkpoint: one 48 MiB BF16 tensor (tied embeddings, so a Llama plan needs nothing
// else), and the byte of it that the fingerprint's content sample does not read: 128 + 4096 + 100
// bytes into the tensor (docs/spec/fingerprint.md, the content sample).
import { closeSync, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { fixtureTensor, writeCheckpoint } from './checkpoints.js';

export const TENSOR = 'model.embed_tokens.weight';

export interface SingleTensorModel {
  dir: string;
  file: string;
  /** Where in the file the unsampled byte is. */
  offset: number;
  /** Where in the file the tensor's bytes begin. */
  begin: number;
}

export async function writeSingleTensorModel(dir: string): Promise<SingleTensorModel> {
  const config = { architectures: ['LlamaForCausalLM'], hidden_size: 4096, num_attention_heads: 32, num_key_value_heads: 8, vocab_size: 6144, num_hidden_layers: 1, intermediate_size: 8192, torch_dtype: 'bfloat16', tie_word_embeddings: true };
  await writeCheckpoint(dir, config, [fixtureTensor(TENSOR, [6144, 4096], 'full')], 1);
  const file = join(dir, 'model.safetensors');
  const { tensors } = await parseSafetensors(file);
  const begin = tensors[0]!.begin;
  return { dir, file, begin, offset: begin + 128 + 4096 + 100 };
}

/** The tensor's bytes as the file holds them now. */
export function tensorBytes(m: SingleTensorModel): Buffer {
  const out = Buffer.alloc(48 << 20);
  const fd = openSync(m.file, 'r');
  try {
    readSync(fd, out, 0, out.length, m.begin);
  } finally {
    closeSync(fd);
  }
  return out;
}

/** Flips the unsampled byte in place (same inode, same size). */
export function flipUnsampledByte(m: SingleTensorModel): void {
  const fd = openSync(m.file, 'r+');
  try {
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, m.offset);
    b[0] = b[0]! ^ 0xff;
    writeSync(fd, b, 0, 1, m.offset);
  } finally {
    closeSync(fd);
  }
}
