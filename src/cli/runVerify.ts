// `weightd verify`: proves, tensor by tensor, that a running daemon holds exactly the bytes of the
// checkpoint on disk now. The daemon digested every tensor while it filled (or carried the
// digests from the keeper's record); this hashes the files again, the same way
// (docs/spec/fingerprint.md §8), and names every tensor whose digest differs.
import { diskDigests } from '../native/diskDigests.js';
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import { sampleWithAddon } from '../native/sampleDigest.js';
import { findSocket } from '../client/findSocket.js';
import { WeightdClient } from '../client/weightdClient.js';
import { settledThreadWork } from '../endProcess.js';
import { errorCode } from '../errors.js';
import { resolveNodeOptions } from '../nodeOptions.js';
import { readNodeManifest } from '../wire/nodeManifest.js';
import { defaultSocketDir } from '../wire/socketDir.js';

export interface VerifyRequest {
  model: string;
  tensorParallelSize?: number;
  planFile?: string;
  socketDir?: string;
  /** The rank whose socket to ask; default the first the node manifest lists. */
  globalRank?: number;
}

/** Exit codes (besides 2, bad flags, which main reports). */
export const VERIFY_EXIT = { equal: 0, differ: 1, cannotCompare: 3 } as const;

export async function runVerify(req: VerifyRequest, write: (line: string) => void = (l) => process.stdout.write(`${l}\n`)): Promise<number> {
  const config = await resolveNodeOptions({ model: req.model, tensorParallelSize: req.tensorParallelSize, planFile: req.planFile });
  const socketDir = req.socketDir ?? defaultSocketDir();
  const { modelDir, tpSize, planFile } = config.models[0];
  let plan: Awaited<ReturnType<typeof planCheckpoint>>;
  try {
    plan = await planCheckpoint(modelDir, { tpSize, planFile, sampler: sampleWithAddon });
  } catch (err) {
    // Exit 1 says a tensor differs; a checkpoint that cannot be read gives nothing to compare.
    // The refusal can leave sibling reads in flight, which must end before the process does.
    await settledThreadWork();
    write(`verify: cannot plan ${modelDir} at tp ${tpSize} (${errorCode(err) ?? 'error'}): ${(err as Error).message}`);
    return VERIFY_EXIT.cannotCompare;
  }
  const onDisk = diskDigests(plan);
  const globalRank = req.globalRank ?? readNodeManifest(socketDir)?.ranks[0]?.globalRank ?? 0;
  // The socket may serve several models: ask for this checkpoint's version of the rank, not the
  // one ping names. A tp group spans the nodes, so the global rank is the tp rank.
  const rank = plan.ranks[globalRank % plan.ranks.length]!;
  let held: Awaited<ReturnType<WeightdClient['contentDigests']>>;
  let socket: string;
  try {
    socket = await findSocket({ socketDir, globalRank });
    const client = await WeightdClient.connect(socket);
    try {
      held = await client.contentDigests(rank.fingerprint);
    } finally {
      client.close();
    }
  } catch (err) {
    await onDisk.catch(() => {});
    // The daemon itself found its files changed since it loaded them (docs/operations.md, stale
    // versions): what it holds is not the files' bytes now.
    if (errorCode(err) === 'E_STALE') {
      write(`verify: the daemon's copy is stale: ${(err as Error).message}`);
      return VERIFY_EXIT.differ;
    }
    write(`verify: cannot ask a daemon for rank ${globalRank} in ${socketDir}: ${(err as Error).message}`);
    return VERIFY_EXIT.cannotCompare;
  }
  const digests = await onDisk;
  if (held && 'status' in held) {
    write(`verify: the daemon on ${socket} serves no version of ${plan.modelDir} with rank ${globalRank % plan.ranks.length}'s fingerprint ${rank.fingerprint} (it does not serve this checkpoint at -tp ${plan.tpSize}, or the files changed where the fingerprint samples them): nothing to compare with; check --model and -tp against weightd status`);
    return VERIFY_EXIT.cannotCompare;
  }
  if (!held) {
    write(`verify: the daemon on ${socket} has no full-content digests (a weightd older than them, or a shard adopted from a keeper record without them): nothing to compare with`);
    return VERIFY_EXIT.cannotCompare;
  }
  const names = rank.contentTensors.names;
  let differ = 0;
  for (const [i, name] of names.entries()) {
    const theirs = held.digests[name];
    if (theirs === digests[i]) continue;
    differ++;
    write(theirs === undefined ? `verify: tensor ${name} is on disk, and the daemon holds no tensor of that name` : `verify: tensor ${name} differs: on disk ${digests[i]}, in the daemon ${theirs}`);
  }
  const extra = Object.keys(held.digests).filter((n) => !names.includes(n));
  for (const name of extra) write(`verify: the daemon holds tensor ${name}, which the checkpoint on disk does not have`);
  differ += extra.length;
  if (differ > 0) {
    write(`verify: ${differ} of ${names.length} tensors differ between ${plan.modelDir} and the daemon on ${socket}: restart or reload it (weightd ctl load) to serve the files' bytes`);
    return VERIFY_EXIT.differ;
  }
  write(`verify: all ${names.length} tensors of ${plan.modelDir} equal what the daemon on ${socket} holds (full content ${held.fingerprint})`);
  return VERIFY_EXIT.equal;
}
