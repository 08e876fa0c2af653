// The models a node serves: the node's own (--model, the one its group forms around) and any
// number of others beside it, each with its own tp size, from repeated --model flags, from a
// --models file (docs/operations.md, Several models) or loaded later (weightd ctl load,
// node.load). Validated here once for all of them, so a bad entry fails before anything loads.
import { readdirSync, statSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { z } from 'zod';
import { isLayoutName, KnownLayoutName, layoutNames } from '../checkpoint/layouts/layoutRegistry.js';
import type { LayoutName } from '../checkpoint/types.js';
import { CheckpointError, schemaIssues, UsageError } from '../errors.js';
import { integer, usage } from '../flagValues.js';
import { readSmallFileSync } from '../files/openRegularFile.js';
import { parseBoundedJson } from '../files/parseBoundedJson.js';
import { ModelName } from '../wire/protocol.js';

/** One model as configured, validated. */
export interface ModelSpec {
  /** What swaps, unloads and watches go by; default: the directory's name. */
  name: string;
  modelDir: string;
  tpSize: number;
  planFile?: string;
  layouts: LayoutName[];
}

/** One model as a caller gives it (NodeOptions.models, node.load, weightd ctl load). */
export interface ModelRequest {
  /** Checkpoint directory. */
  model: string;
  name?: string;
  tensorParallelSize?: number;
  planFile?: string;
  layouts?: string[];
}

/** A --models file bigger than this is not a list of models. */
const MAX_MODELS_FILE_BYTES = 1 << 20;
/** Models one node may be configured with at start. */
export const MAX_MODELS = 64;

/** The --models file (docs/operations.md): unknown keys are refused, so a typo is not ignored. */
export const ModelsFile = z.strictObject({
  models: z
    .array(
      z.strictObject({
        name: ModelName.optional(),
        /** Relative to the file's directory. */
        dir: z.string().min(1).max(4096),
        tensorParallelSize: z.number().int().min(1).max(4096).optional(),
        planFile: z.string().min(1).max(4096).optional(),
        layouts: z.array(KnownLayoutName).optional(),
      }),
    )
    .min(1)
    .max(MAX_MODELS),
});

export function checkLayouts(layouts: unknown): LayoutName[] {
  const names = layouts ?? [];
  if (!Array.isArray(names) || !names.every(isLayoutName)) {
    throw usage('--layouts', names, 'names a layout weightd does not plan', `use a comma-separated list of ${layoutNames().join(', ')}`);
  }
  return [...new Set(names)];
}

export function checkModelDir(model: unknown): string {
  if (typeof model !== 'string' || model === '') {
    throw usage('--model', model, 'is required', 'pass the directory that holds the checkpoint (*.safetensors and config.json)');
  }
  const dir = resolve(model);
  let entries: string[];
  try {
    if (!statSync(dir).isDirectory()) throw usage('--model', model, 'is not a directory', 'pass the checkpoint directory, not a file');
    entries = readdirSync(dir);
  } catch (err) {
    if (err instanceof UsageError) throw err;
    throw usage('--model', model, `cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`, 'check the path and its permissions');
  }
  if (!entries.some((e) => e.endsWith('.safetensors'))) {
    throw usage('--model', model, 'holds no .safetensors file', 'pass a directory with a safetensors checkpoint (a Hugging Face model directory)');
  }
  return dir;
}

/** A model's name: given, or its directory's name made into one (dots, dashes and underscores kept). */
function checkName(name: unknown, dir: string): string {
  const value = name ?? basename(dir).replace(/[^A-Za-z0-9._-]/g, '_').replace(/^[._-]+/, '').slice(0, 128);
  const parsed = ModelName.safeParse(value);
  if (!parsed.success) throw usage('--name', value, 'is not a model name', 'use 1-128 letters, digits, dots, dashes and underscores, starting with a letter or digit');
  return parsed.data;
}

/** Validates one model; `flags` names where its values came from, for the messages. */
export function resolveModelSpec(m: ModelRequest): ModelSpec {
  const modelDir = checkModelDir(m.model);
  return {
    name: checkName(m.name, modelDir),
    modelDir,
    tpSize: integer('--tensor-parallel-size', m.tensorParallelSize ?? 1, 1, 4096, 'pass the number of tensor-parallel ranks, at least 1'),
    planFile: m.planFile === undefined ? undefined : resolve(m.planFile),
    layouts: checkLayouts(m.layouts),
  };
}

/** Validates a node's models together: each alone, and no name twice. */
export function resolveModelSpecs(models: ModelRequest[]): ModelSpec[] {
  if (models.length > MAX_MODELS) throw usage('--model', models.length, `is given more than ${MAX_MODELS} times`, 'serve fewer models from one daemon');
  const specs = models.map(resolveModelSpec);
  const seen = new Map<string, string>();
  for (const s of specs) {
    const other = seen.get(s.name);
    if (other !== undefined) {
      throw usage('--model', s.modelDir, `has the same name "${s.name}" as ${other}`, 'give each model its own name (a --models file with "name" entries)');
    }
    seen.set(s.name, s.modelDir);
  }
  return specs;
}

/** Reads a --models file into model requests, directories resolved against the file's directory. */
export function readModelsFile(path: string): ModelRequest[] {
  const file = resolve(path);
  let text: string;
  try {
    // The one regular-file rule: a FIFO or a device planted at the path is refused, not read.
    text = readSmallFileSync(file, MAX_MODELS_FILE_BYTES);
  } catch (err) {
    const why = err instanceof CheckpointError ? err.message.replace(`${file} `, '') : ((err as NodeJS.ErrnoException).code ?? (err as Error).message);
    throw usage('--models', path, `cannot be read (${why})`, 'pass a JSON file as docs/operations.md (Several models) describes');
  }
  let json: unknown;
  try {
    json = parseBoundedJson(text);
  } catch (err) {
    // parseBoundedJson's message names the position and the problem, never the file's bytes.
    throw usage('--models', path, `is not JSON: ${(err as Error).message}`, 'pass a JSON file as docs/operations.md (Several models) describes');
  }
  const parsed = ModelsFile.safeParse(json);
  if (!parsed.success) {
    throw usage('--models', path, `does not match the models schema: ${schemaIssues(parsed.error.issues)}`, 'see docs/operations.md (Several models) for the schema');
  }
  const base = dirname(file);
  return parsed.data.models.map((m) => ({
    model: resolve(base, m.dir),
    name: m.name,
    tensorParallelSize: m.tensorParallelSize,
    planFile: m.planFile === undefined ? undefined : resolve(base, m.planFile),
    layouts: m.layouts,
  }));
}
