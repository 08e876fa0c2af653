// One client of the swap test, as its own process: node dist/test/models/swapClient.js <versions-json> <sockets-json>
// Attaches every rank of the first version, checks the bytes of a few tensors on each against
// that version's, and detaches, in a loop: told the version drains (E_DRAINING) or gone (a
// mismatch), it moves to the version the daemon names. It prints "warm" once it attached twice,
// and exits with a JSON line once it attached the last version three times.
import { createHash } from 'node:crypto';
import { WeightdClient, type Attached } from '../../src/client/index.js';
import type { HostTensor } from '../../src/client/segmentAccess.js';
import { ServeError } from '../../src/errors.js';

export interface SwapVersion {
  name: string;
  fingerprints: string[];
  /** sha256 of each checked tensor, per rank. */
  hashes: Array<Record<string, string>>;
}

export interface SwapReport {
  attaches: Record<string, number>;
  /** Attachments whose bytes were not all of the version asked for. */
  mixes: string[];
  drainingRefusals: number;
  /** Leases of any version that had ended before their holder detached them. */
  endedUnderHolder: number;
}

const [versionsJson, socketsJson] = process.argv.slice(2);
const versions = JSON.parse(versionsJson!) as SwapVersion[];
const sockets = JSON.parse(socketsJson!) as string[];
const byFingerprint = new Map(versions.flatMap((v) => v.fingerprints.map((f) => [f, v] as const)));
const last = versions.at(-1)!;
const conns = await Promise.all(sockets.map((s) => WeightdClient.connect(s, { clientName: `swap-${process.pid}` })));
const report: SwapReport = { attaches: {}, mixes: [], drainingRefusals: 0, endedUnderHolder: 0 };
let current = versions[0]!;
let warm = false;

while ((report.attaches[last.name] ?? 0) < 3) {
  const held: Attached[] = [];
  let moveTo: SwapVersion | undefined;
  try {
    for (const [r, conn] of conns.entries()) {
      const a = await conn.attach({ fingerprint: current.fingerprints[r]! });
      if (a.status === 'mismatch') {
        // The version is gone from this socket: the reply lists what it serves.
        moveTo = byFingerprint.get(a.models!.find((m) => m.status === 'serving' && byFingerprint.has(m.fingerprint))!.fingerprint);
        break;
      }
      held.push(a);
    }
  } catch (err) {
    // Draining, or already being freed or freed: the daemon names the version to move to.
    if (!(err instanceof ServeError) || typeof err.details.newer !== 'string') throw err;
    report.drainingRefusals++;
    moveTo = byFingerprint.get(err.details.newer as string);
  }
  if (held.length === conns.length) {
    report.attaches[current.name] = (report.attaches[current.name] ?? 0) + 1;
    held.forEach((a, r) => {
      for (const [tensor, hash] of Object.entries(current.hashes[r]!)) {
        const t = (a.tensors as Record<string, HostTensor>)[tensor]!;
        if (createHash('sha256').update(t.data).digest('hex') !== hash) report.mixes.push(`rank ${r} ${tensor} is not ${current.name}'s`);
      }
    });
    if (!warm && report.attaches[current.name]! >= 2) {
      warm = true;
      process.stdout.write('warm\n');
    }
  }
  for (const a of held) if ((await a.detach()) !== 1) report.endedUnderHolder++;
  if (moveTo) current = moveTo;
}
for (const c of conns) c.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
