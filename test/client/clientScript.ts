// A client process for the end-to-end tests: node dist/test/client/clientScript.js <command> <socket> <expected-json> [arg]
//   hashes map|copy  attach (or copy), print {tensors: {name: {sha256, ...}}} for every tensor and alias,
//                    detach (a cuda attach prints device pointers instead of hashes); with the segment
//                    mappings and descriptors held while attached and after
//   hold             attach zero-copy, print {leaseId, pid}, then keep the mapping until killed
//   loop <ms>        attach/verify/detach in a loop for <ms>, print {iterations, mapsBefore, mapsAfter,
//                    openFdsAfterFirst, openFdsAfter}
// One JSON line on stdout; errors go to stderr with exit code 1.
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { WeightdClient, type Expected, type HostTensor } from '../../src/client/index.js';

const [command, socketPath, expectedJson, arg] = process.argv.slice(2);
const expected = JSON.parse(expectedJson!) as Expected;

function sha(t: HostTensor): string {
  return createHash('sha256').update(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength)).digest('hex');
}

/** Lines of this process's memory map that are weightd segments (memfds, "/memfd:weightd:..."). */
function segmentMaps(): number {
  return readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:weightd:')).length;
}

/** This process's open descriptors' targets. */
function openFds(): string[] {
  return readdirSync('/proc/self/fd').flatMap((fd) => {
    try {
      return [readlinkSync(`/proc/self/fd/${fd}`)];
    } catch {
      return []; // the listing's own descriptor
    }
  });
}

/** Segment descriptors this process holds: the client closes each right after mapping it. */
const segmentFds = () => openFds().filter((t) => t.startsWith('/memfd:weightd:')).length;

function print(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

const client = await WeightdClient.connect(socketPath!);
try {
  switch (command) {
    case 'hashes': {
      const result = arg === 'copy' ? await client.copy(expected) : await client.attach(expected);
      if (result.status === 'mismatch') {
        print({ mismatch: result.fields });
        break;
      }
      if (result.status === 'attached' && result.backend === 'cuda') {
        const pointers = Object.fromEntries(Object.entries(result.tensors).map(([name, t]) => [name, { pointer: `0x${t.pointer.toString(16)}`, shape: t.shape }]));
        await result.detach();
        print({ tensors: pointers });
        break;
      }
      const tensors = result.tensors as Record<string, HostTensor>;
      const hashes = Object.fromEntries(Object.entries(tensors).map(([name, t]) => [name, { sha256: sha(t), dtype: t.dtype, shape: t.shape, ctor: t.data.constructor.name }]));
      const mapsWhileAttached = segmentMaps();
      const fdsWhileAttached = segmentFds();
      if (result.status === 'attached') await result.detach();
      print({ tensors: hashes, mapsWhileAttached, mapsAfter: segmentMaps(), fdsWhileAttached, fdsAfter: segmentFds() });
      break;
    }
    case 'hold': {
      const result = await client.attach(expected);
      if (result.status !== 'attached') throw new Error(`mismatch: ${result.fields.join(', ')}`);
      print({ leaseId: result.leaseId, pid: process.pid });
      client.close();
      setInterval(() => {}, 1 << 30); // keep the mapping until the test kills us
      break;
    }
    case 'loop': {
      const until = Date.now() + Number(arg);
      const mapsBefore = segmentMaps();
      let iterations = 0;
      let openFdsAfterFirst = 0;
      let reference: string | undefined;
      while (Date.now() < until) {
        const result = await client.attach(expected);
        if (result.status !== 'attached' || result.backend !== 'host') throw new Error('attach failed');
        // Hash one tensor each time: the bytes must never change under a live lease.
        const first = Object.values(result.tensors)[0]!;
        const h = sha(first);
        if (reference !== undefined && h !== reference) throw new Error(`tensor bytes changed between attaches: ${reference} -> ${h}`);
        reference = h;
        await result.detach();
        if (++iterations === 1) openFdsAfterFirst = openFds().length;
      }
      print({ iterations, mapsBefore, mapsAfter: segmentMaps(), openFdsAfterFirst, openFdsAfter: openFds().length });
      break;
    }
    default:
      throw new Error(`unknown command ${command}`);
  }
} catch (err) {
  process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
} finally {
  if (command !== 'hold') client.close();
}
