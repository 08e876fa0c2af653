// Finds the weight files of a model directory: the shards named by model.safetensors.index.json,
// or a lone model.safetensors. Any other .safetensors file in the directory is an error rather
// than silently loaded or silently skipped: leftovers of an interrupted download or a second
// export would otherwise decide which bytes the engine gets.

import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { CheckpointError } from '../errors.js';
import { findDuplicateJsonKey } from './findDuplicateJsonKey.js';
import { isRegularFile, MAX_INDEX_BYTES, readSmallFile } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';
import type { SafetensorsHeader } from './parseSafetensors.js';

export const INDEX_FILE = 'model.safetensors.index.json';
export const SINGLE_FILE = 'model.safetensors';

/** Files an error names one by one; a directory of 10,000 stray shards made a 240 KB log line. */
const NAMED_FILES = 10;

/** The first NAMED_FILES of `names`, and how many more there are. */
function someOf(names: string[]): string {
  const more = names.length - NAMED_FILES;
  return more > 0 ? `${names.slice(0, NAMED_FILES).join(', ')} and ${more} more` : names.join(', ');
}

export interface CheckpointFiles {
  /** File names relative to the model directory, sorted. */
  files: string[];
  /** tensor name -> file name, from the index; null for a single-file checkpoint. */
  weightMap: Map<string, string> | null;
}

/**
 * tensor name -> file name. Checked in one loop, not as a zod record: at 50k tensors the record
 * schema cost the main thread 60-110 ms of a start-up, four times this.
 */
const weightMapSchema = z
  .custom<Record<string, string>>((v) => typeof v === 'object' && v !== null && !Array.isArray(v), { message: 'expected an object of tensor name -> file name' })
  .superRefine((map, ctx) => {
    for (const name in map) {
      if (typeof map[name] !== 'string') {
        ctx.addIssue({ code: 'custom', path: [name], message: `expected a file name (a string), got ${JSON.stringify(map[name])}` });
        return;
      }
    }
  });

const indexSchema = z.looseObject({
  metadata: z.record(z.string(), z.unknown()).nullish(),
  weight_map: weightMapSchema,
});

export async function readCheckpointIndex(modelDir: string): Promise<CheckpointFiles> {
  let names: string[];
  try {
    names = await readdir(modelDir);
  } catch (err) {
    throw new CheckpointError('E_CKPT_DIR', `${modelDir}: cannot list the model directory (${(err as Error).message})`, { dir: modelDir });
  }
  const present = names.filter((n) => n.endsWith('.safetensors')).sort();
  const indexPath = join(modelDir, INDEX_FILE);

  if (!(await isRegularFile(indexPath))) {
    if (!present.includes(SINGLE_FILE)) {
      throw new CheckpointError('E_CKPT_NO_WEIGHTS', `${modelDir}: neither ${INDEX_FILE} nor ${SINGLE_FILE} is here${present.length ? ` (found ${someOf(present)}; add an index that lists them)` : ''}; point at a Hugging Face model directory with safetensors weights`, { dir: modelDir });
    }
    const extra = present.filter((n) => n !== SINGLE_FILE);
    if (extra.length) {
      throw new CheckpointError('E_CKPT_UNLISTED_FILE', `${modelDir}: ${someOf(extra)} would not be loaded: the directory has a single ${SINGLE_FILE} and no ${INDEX_FILE}. Remove the extra files, or add an index that lists every shard`, { dir: modelDir, files: extra.slice(0, NAMED_FILES), count: extra.length });
    }
    return { files: [SINGLE_FILE], weightMap: null };
  }

  let text: string;
  try {
    text = await readSmallFile(indexPath, MAX_INDEX_BYTES);
  } catch (err) {
    if (err instanceof CheckpointError) throw err;
    throw new CheckpointError('E_CKPT_INDEX_READ', `${indexPath}: cannot read the index (${(err as Error).message})`, { file: indexPath });
  }
  let json: unknown;
  try {
    json = parseBoundedJson(text);
  } catch (err) {
    throw new CheckpointError('E_CKPT_INDEX_JSON', `${indexPath}: not valid JSON (${(err as Error).message}); download the index again`, { file: indexPath });
  }
  const parsed = indexSchema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
    throw new CheckpointError('E_CKPT_INDEX_SCHEMA', `${indexPath}: ${issues}; an index needs "weight_map": {tensor name: file name}`, { file: indexPath });
  }
  const dup = findDuplicateJsonKey(text);
  if (dup) {
    const where = dup.path.length ? `"${dup.path.join('.')}"` : 'the top level';
    throw new CheckpointError('E_CKPT_INDEX_DUPLICATE', `${indexPath}: key "${dup.key}" appears twice in ${where}; JSON readers would keep only the last. Keep one entry`, { file: indexPath, key: dup.key });
  }
  const weightMap = new Map(Object.entries(parsed.data.weight_map));
  const listed = [...new Set(weightMap.values())].sort();
  for (const file of listed) {
    // The index is data from the internet: it must not point outside the model directory.
    if (file !== file.trim() || file.includes('/') || file.includes('\\') || file === '.' || file === '..' || !file.endsWith('.safetensors')) {
      throw new CheckpointError('E_CKPT_INDEX_BAD_PATH', `${indexPath}: "${file}" is not a plain .safetensors file name in the model directory; the index may only name files next to it`, { file: indexPath, shard: file });
    }
    if (!(await isRegularFile(join(modelDir, file)))) {
      const tensor = [...weightMap].find(([, f]) => f === file)![0];
      throw new CheckpointError('E_CKPT_INDEX_MISSING_FILE', `${indexPath}: shard ${file} (holding "${tensor}" and others) is missing from ${modelDir}; the download is incomplete: fetch it again`, { file: indexPath, shard: file, tensor });
    }
  }
  const unlisted = present.filter((n) => !listed.includes(n));
  if (unlisted.length) {
    throw new CheckpointError('E_CKPT_UNLISTED_FILE', `${modelDir}: ${someOf(unlisted)} ${unlisted.length > 1 ? 'are' : 'is'} not in ${INDEX_FILE}, so ${unlisted.length > 1 ? 'they' : 'it'} would never be loaded; remove ${unlisted.length > 1 ? 'them' : 'it'} or fix the index`, { dir: modelDir, files: unlisted.slice(0, NAMED_FILES), count: unlisted.length });
  }
  return { files: listed, weightMap };
}

/**
 * Checks the parsed headers against the index: each tensor is in exactly one file, and that
 * file is the one the index names. Without an index, only uniqueness across files applies.
 */
export function checkTensorsAgainstIndex(index: CheckpointFiles, headers: SafetensorsHeader[], indexPath: string): void {
  const seen = new Map<string, string>();
  headers.forEach((h, i) => {
    const file = index.files[i]!;
    for (const t of h.tensors) {
      const other = seen.get(t.name);
      if (other !== undefined) {
        throw new CheckpointError('E_CKPT_DUPLICATE_TENSOR', `tensor "${t.name}" is stored in both ${other} and ${file}; a checkpoint must hold each tensor once. Remove the stale shard`, { tensor: t.name, files: [other, file] });
      }
      seen.set(t.name, file);
      if (index.weightMap) {
        const expected = index.weightMap.get(t.name);
        if (expected === undefined) {
          throw new CheckpointError('E_CKPT_INDEX_UNLISTED_TENSOR', `${indexPath}: tensor "${t.name}" in ${file} is not in weight_map; the index and the shards come from different exports`, { tensor: t.name, shard: file });
        }
        if (expected !== file) {
          throw new CheckpointError('E_CKPT_INDEX_WRONG_FILE', `${indexPath}: weight_map puts tensor "${t.name}" in ${expected}, but it is in ${file}; the index and the shards come from different exports`, { tensor: t.name, shard: file, expected });
        }
      }
    }
  });
  if (index.weightMap) {
    for (const [tensor, file] of index.weightMap) {
      if (!seen.has(tensor)) {
        throw new CheckpointError('E_CKPT_INDEX_MISSING_TENSOR', `${indexPath}: weight_map puts tensor "${tensor}" in ${file}, but ${file} does not hold it; the index and the shards come from different exports`, { tensor, shard: file });
      }
    }
  }
}
