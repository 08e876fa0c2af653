// Reads the few fields of a Hugging Face config.json that decide how a checkpoint is sharded.
// Everything else in the file is left alone (passthrough), since configs carry dozens of
// model-specific keys.

import { join } from 'node:path';
import { z } from 'zod';
import { CheckpointError } from '../errors.js';
import { MAX_CONFIG_BYTES, readSmallFile } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';

export interface ModelConfig {
  architecture: string;
  numAttentionHeads: number | null;
  numKeyValueHeads: number | null;
  headDim: number | null;
  /** null when config.json does not say; the architecture family's default then applies. */
  tieWordEmbeddings: boolean | null;
  torchDtype: string | null;
  /** quantization_config as written, or null. Part of the fingerprint. */
  quantization: unknown;
}

const positiveInt = z.number().int().positive();

const configSchema = z.looseObject({
  architectures: z.array(z.string().min(1)).min(1),
  num_attention_heads: positiveInt.optional(),
  num_key_value_heads: positiveInt.nullish(),
  head_dim: positiveInt.nullish(),
  hidden_size: positiveInt.optional(),
  tie_word_embeddings: z.boolean().optional(),
  torch_dtype: z.string().nullish(),
  dtype: z.string().nullish(),
  quantization_config: z.unknown().optional(),
});

export async function readModelConfig(modelDir: string): Promise<ModelConfig> {
  const path = join(modelDir, 'config.json');
  let text: string;
  try {
    text = await readSmallFile(path, MAX_CONFIG_BYTES);
  } catch (err) {
    if (err instanceof CheckpointError) throw err;
    throw new CheckpointError('E_CKPT_NO_CONFIG', `${path}: cannot read the model's config.json (${(err as Error).message}); the model directory must hold the Hugging Face config next to the weights`, { file: path });
  }
  let json: unknown;
  try {
    json = parseBoundedJson(text);
  } catch (err) {
    throw new CheckpointError('E_CKPT_CONFIG', `${path}: not valid JSON (${(err as Error).message})`, { file: path });
  }
  const parsed = configSchema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
    throw new CheckpointError('E_CKPT_CONFIG', `${path}: ${issues}. config.json needs "architectures": ["<ModelClass>"] and valid head counts`, { file: path });
  }
  const c = parsed.data;
  const heads = c.num_attention_heads ?? null;
  const headDim = c.head_dim ?? (heads !== null && c.hidden_size !== undefined && c.hidden_size % heads === 0 ? c.hidden_size / heads : null);
  return {
    architecture: c.architectures[0]!,
    numAttentionHeads: heads,
    numKeyValueHeads: c.num_key_value_heads ?? heads,
    headDim,
    tieWordEmbeddings: c.tie_word_embeddings ?? null,
    torchDtype: c.torch_dtype ?? c.dtype ?? null,
    quantization: c.quantization_config ?? null,
  };
}
