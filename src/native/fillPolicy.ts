// How fills are sized: the one place that decides reader threads, chunk and staging sizes, and
// whether a load reads through the page cache. The addon takes these numbers as given (it
// refuses a fill without them, native/fill_args.cpp) and only keeps them within what its
// mechanics need. Imports no addon: the CLI's help and option checks quote these numbers.
import { randomUUID } from 'node:crypto';
import type { DeviceSlot, FillOptions, NativeFillOptions } from './addon.js';
import { UsageError } from '../errors.js';

const MiB = 2 ** 20;

/**
 * What a fill uses unless told otherwise, measured on an H200 host (docs/gpu-results.md): small
 * chunks and little staging keep the pinned buffers in the CPU cache between the read and the
 * DMA. From the page cache, 8 threads filled at 37-40 GB/s with 2 MiB chunks (32 MiB staging), 27
 * with 8 MiB, 19 with 16. In a group (several GPUs), threads and stagingBytes count per GPU's
 * worth of distinct bytes read, and the copy engine scales them by what the group reads
 * (native/cuda_copy_engine.cpp); the group's staging stays under max(stagingBytes,
 * maxGroupStagingBytes), so the daemon's pinned memory stays under 1 GiB on any node (a cold
 * tp=8 load would otherwise pin 1 GiB).
 */
export const FILL_SIZING = { threads: 8, chunkBytes: 2 * MiB, stagingBytes: 32 * MiB, maxGroupStagingBytes: 512 * MiB } as const;

/**
 * The pinned staging a hot cuda fill of `gpus` GPUs' worth of bytes makes with FILL_SIZING (its
 * budget, which the copy engine's slots stay within), for the CUDA warm-up to pin ahead
 * (native/pinned_stash.h): a fill that needs more, or a cold one (COLD_FILL), pins its own.
 */
export function hotFillStagingBytes(gpus: number): number {
  return Math.min(FILL_SIZING.stagingBytes * Math.max(1, gpus), Math.max(FILL_SIZING.stagingBytes, FILL_SIZING.maxGroupStagingBytes));
}

/** Below this share of the checkpoint in the page cache, a cuda load is a cold one. */
const COLD_CACHE_SHARE = 0.5;

/**
 * What a cold cuda load uses unless the options say otherwise: O_DIRECT reads of 8 MiB into
 * 128 MiB of staging per GPU. On the H200 host that read a cold checkpoint at 1.05x `cat`,
 * against 0.92x through the page cache, while a warm one through O_DIRECT is 10x slower than
 * through the cache (docs/gpu-results.md): hence the look at the cache first.
 */
const COLD_FILL: FillOptions = { direct: true, chunkBytes: 8 * MiB, stagingBytes: 128 * MiB };

/**
 * The fill options every rank of one node gets. Several GPUs fill as one group (one pass over the
 * files, each window copied to every GPU that needs it: native/cuda_fill_group.h), so bytes that
 * several ranks need are read from the page cache once. A cuda load whose files are mostly not
 * in the page cache (`share`, called only then: cachedShare of the files) reads them with
 * O_DIRECT, unless `fill.direct` says otherwise. Host ranks fill alone, through the cache, but
 * several of them name a group too: they share the hashing of the content digests
 * (native/host_digest_group.h), which each rank alone did for the whole checkpoint.
 */
export async function nodeFillOptions(
  fill: FillOptions,
  devices: readonly DeviceSlot[],
  share: () => Promise<number> = async () => 1,
  env: NodeJS.ProcessEnv = process.env,
): Promise<FillOptions> {
  const group = devices.length > 1 ? { group: { id: randomUUID(), size: devices.length } } : {};
  if (devices.length > 0 && devices.every((d) => d.backend === 'host')) return { ...fill, ...group };
  if (devices.length === 0 || !devices.every((d) => d.backend === 'cuda')) return fill;
  let out = fill;
  if (out.digestOn === undefined) out = { ...out, digestOn: cudaDigestsOn(env) };
  if (fill.direct === undefined && (await share()) < COLD_CACHE_SHARE) out = { ...COLD_FILL, ...out, direct: true };
  return { ...out, ...group };
}

/** The runtime switch for where a cuda fill hashes its digests (docs/operations.md); not the CMake option that builds the kernel. */
export const DIGESTS_ON_VARIABLE = 'WEIGHTD_FILL_DIGESTS_ON';

/** Where content digests are hashed on cuda when nothing chose (cudaDigestsOn says why the GPU). */
export const DEFAULT_DIGESTS_ON = 'gpu';

/**
 * Where a cuda fill that did not choose hashes its digests: on the GPU. On the H200 (2026-12-05,
 * test/gpu/RESULTS.md) the kernel's digests equalled the CPU's at tp=1 and tp=2, and a hot 8 GiB
 * fill kept 0.97 of its speed without digests against 0.69 hashing on the CPU. Where the kernel
 * is missing or cannot load, the addon hashes on the CPU and says why (digestGpuUnavailable).
 * WEIGHTD_FILL_DIGESTS_ON=cpu keeps the CPU, to compare or to work around a kernel fault. A
 * writer's commit on cuda (src/serve/cudaUpdateSegments.ts) and a processed layout's
 * (src/serve/publishDesk.ts) hash with the same kernel, so they take the fill's digestOn as this
 * resolved it (ServedRankData.digestOn), never the variable again: a digestOn passed in code is the
 * whole node's. verify of a cuda written version (src/cli/verifyWritten.ts), a process of its own,
 * takes its request's digestOn, else this switch.
 */
export function cudaDigestsOn(env: NodeJS.ProcessEnv = process.env): 'gpu' | 'cpu' {
  const raw = env[DIGESTS_ON_VARIABLE];
  if (raw === undefined || raw === '') return DEFAULT_DIGESTS_ON;
  if (raw === 'gpu' || raw === 'cpu') return raw;
  throw new UsageError('E_USAGE', `${DIGESTS_ON_VARIABLE}=${JSON.stringify(raw)}: must be gpu or cpu; unset it to hash on the GPU where the digest kernel is built`, { variable: DIGESTS_ON_VARIABLE, value: raw, allowed: ['gpu', 'cpu'] });
}

/** The options the addon gets: the caller's choices, and FILL_SIZING for every number left open. */
export function fillSizing(options: FillOptions): NativeFillOptions {
  const chosen = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as FillOptions;
  return { ...FILL_SIZING, ...chosen };
}
