// `weightd verify --name NAME --version N`: proves, tensor by tensor, that a running daemon's
// version a writer committed (docs/weight-updates.md) still holds what was written. Such a version
// has no checkpoint files to hash again: this maps its memory (a copy lease: the host's memfds, or
// the GPU's allocations imported read-only, digested on the GPU where the kernel is), digests
// every tensor there with the commit's digest code, and compares each with the digest the commit
// recorded, which the daemon serves as the version's content (docs/spec/fingerprint.md §9).
import { findSocket } from '../client/findSocket.js';
import { WeightdClient } from '../client/weightdClient.js';
import { errorCode } from '../errors.js';
import { addon } from '../native/addon.js';
import { cudaProbe } from '../native/cuda.js';
import { cudaDigestsOn, DIGESTS_ON_VARIABLE } from '../native/fillPolicy.js';
import { packTensorRanges } from '../native/fillRecords.js';
import { readNodeManifest } from '../wire/nodeManifest.js';
import { defaultSocketDir } from '../wire/socketDir.js';
import { VERIFY_EXIT } from './runVerify.js';

export interface VerifyWrittenRequest {
  name: string;
  version: number;
  socketDir?: string;
  /** The rank whose socket to ask; default the first the node manifest lists. */
  globalRank?: number;
  /** cuda: where to hash the version's digests; default WEIGHTD_FILL_DIGESTS_ON's (cudaDigestsOn). */
  digestOn?: 'gpu' | 'cpu';
}

/** Threads that digest the version (a check beside serving engines: a few). */
const DIGEST_THREADS = 4;

export async function verifyWritten(req: VerifyWrittenRequest, write: (line: string) => void = (l) => process.stdout.write(`${l}\n`)): Promise<number> {
  const socketDir = req.socketDir ?? defaultSocketDir();
  const globalRank = req.globalRank ?? readNodeManifest(socketDir)?.ranks[0]?.globalRank ?? 0;
  const what = `version ${req.version} of model "${req.name}"`;
  let socket: string;
  let client: WeightdClient;
  try {
    socket = await findSocket({ socketDir, globalRank });
    client = await WeightdClient.connect(socket);
  } catch (err) {
    write(`verify: cannot ask a daemon for rank ${globalRank} in ${socketDir}: ${(err as Error).message}`);
    return VERIFY_EXIT.cannotCompare;
  }
  try {
    const served = (await client.ping()).models?.find((m) => m.name === req.name && (m.version ?? 0) === req.version && m.status === 'serving');
    if (!served) {
      write(`verify: the daemon on ${socket} serves no ${what} (weightd ctl list shows the versions it holds)`);
      return VERIFY_EXIT.cannotCompare;
    }
    const recorded = await client.contentDigests(served.fingerprint);
    if (!recorded || 'status' in recorded) {
      write(`verify: the daemon on ${socket} has no digests recorded for ${what}: nothing to compare with`);
      return VERIFY_EXIT.cannotCompare;
    }
    if (recorded.fingerprint !== served.fingerprint) {
      write(`verify: ${what} is a checkpoint's version, which has files: verify it with --model against its checkpoint directory`);
      return VERIFY_EXIT.cannotCompare;
    }
    const state = await client.getState({ fingerprint: served.fingerprint }, 'copy');
    if (state.status === 'mismatch') {
      write(`verify: ${what} stopped serving on ${socket} while it was asked for`);
      return VERIFY_EXIT.cannotCompare;
    }
    let memory: string[];
    try {
      // cuda: the GPU the rank serves on, as this process numbers it.
      let deviceIndex = -1;
      if (state.backend === 'cuda') {
        const probe = await cudaProbe();
        deviceIndex = probe.devices.find((d) => d.uuid === state.device.uuid)?.index ?? -1;
        if (deviceIndex < 0) {
          write(`verify: ${what} serves on GPU ${state.device.uuid}, which this process does not see (${probe.available ? `${probe.devices.length} visible` : probe.reason}): run verify where CUDA_VISIBLE_DEVICES includes it`);
          return VERIFY_EXIT.cannotCompare;
        }
      }
      const fds = await client.segmentFds(state.leaseId);
      try {
        const order = [...fds.keys()].sort((a, b) => a - b);
        const position = new Map(order.map((segment, i) => [segment, i]));
        const ranges = packTensorRanges(state.tensors.map((t) => ({ file: position.get(t.segment)!, start: t.offset, end: t.offset + t.bytes })));
        if (deviceIndex < 0) {
          memory = await addon().digestFiles(order.map((s) => `/proc/self/fd/${fds.get(s)!}`), ranges, DIGEST_THREADS);
        } else {
          // The allocations, imported read-only, digested where a fill would hash them: on the GPU
          // unless the request's digestOn (else WEIGHTD_FILL_DIGESTS_ON) says cpu or the kernel is
          // missing (read back to the host then).
          const bytes = order.map((s) => state.segments.find((ref) => ref.segment === s)!.bytes);
          const digestOn = req.digestOn ?? cudaDigestsOn();
          const digested = await addon().cudaDigestSegments(deviceIndex, order.map((s) => fds.get(s)!), bytes, ranges, DIGEST_THREADS, digestOn);
          const asked = req.digestOn === undefined ? `${DIGESTS_ON_VARIABLE}=cpu` : "digestOn 'cpu'";
          if (digested.hashedOn === 'cpu') write(`verify: digests hashed on the CPU, read back from the GPU: ${digested.gpuDigestUnavailable || asked}`);
          memory = digested.digests;
        }
      } finally {
        for (const fd of fds.values()) addon().closeFd(fd);
      }
    } finally {
      await client.detach(state.leaseId).catch(() => 0);
    }
    let differ = 0;
    for (const [i, t] of state.tensors.entries()) {
      const theirs = recorded.digests[t.name];
      if (theirs === memory[i]) continue;
      differ++;
      write(theirs === undefined ? `verify: tensor ${t.name} has no recorded digest` : `verify: tensor ${t.name} differs: recorded at the commit ${theirs}, in the daemon's memory now ${memory[i]}`);
    }
    if (differ > 0) {
      write(`verify: ${differ} of ${state.tensors.length} tensors of ${what} differ from what its commit recorded on ${socket}: the memory changed after the commit; roll back or write the version again`);
      return VERIFY_EXIT.differ;
    }
    write(`verify: all ${state.tensors.length} tensors of ${what} (written, no files: the daemon's memory digested against the digests its commit recorded) are as committed on ${socket} (fingerprint ${served.fingerprint})`);
    return VERIFY_EXIT.equal;
  } catch (err) {
    write(`verify: cannot read ${what} on ${socket} (${errorCode(err) ?? 'error'}): ${(err as Error).message}`);
    return VERIFY_EXIT.cannotCompare;
  } finally {
    client.close();
  }
}
