// Publishes in progress on this node (docs/engines.md, "Publishing what the engine computed"): an
// engine that processed a served version's parameters (requantized, repacked them for its kernel)
// asks a rank's socket for fresh memory of the sizes it names (begin_publish), writes what it
// computed, and commits (commit_publish); the daemon seals and digests it, as a writer's update
// (updateDesk.ts, the same native segments), and serves it beside the version under the key the
// engine computed (processedLayouts.ts), never as a version of its own. A connection of a
// publish that ends takes it away; a second publish of a key is refused, the first is to be mapped.
import { randomBytes } from 'node:crypto';
import { isDtype, tensorBits } from '../checkpoint/dtypes.js';
import { ServeError } from '../errors.js';
import { DEFAULT_PROCESSED_MAX_PERCENT } from '../nodeDefaults.js';
import type { Backend } from '../native/addon.js';
import { addon } from '../native/addon.js';
import { packTensorRanges } from '../native/fillRecords.js';
import { DEFAULT_DIGESTS_ON } from '../native/fillPolicy.js';
import { refuseUnlessCudaFd } from './cudaUpdateSegments.js';
import type { PublishTensor, TensorMeta } from '../wire/protocol.js';
import type { Caller } from './leaseTable.js';
import { PROCESSED_MAX_LAYOUTS, type ProcessedLayout } from './processedLayouts.js';
import type { RankService } from './rankService.js';

/** Where each published tensor starts: a multiple of this, as a fill places tensors, so any dtype's view is aligned. */
const TENSOR_ALIGN = 256;

/**
 * How a backend makes a publish's memory and commits it: host, sealed memfds (updateDesk.ts's
 * segments); cuda, staging VMM allocations copied at commit into final ones no writer maps
 * (cudaUpdateSegments.ts), as a writer's update on each backend.
 */
export interface PublishBackend {
  /** What get_processed and begin_publish call the segments' handles (docs/protocol.md). */
  handle: string;
  /** A fresh writable segment of `bytes` (a descriptor the writer maps); E_OUT_OF_MEMORY when it does not fit. */
  create(service: RankService, bytes: number, name: string): Promise<number>;
  /**
   * Makes what was written unwritable to everyone and digests `ranges` of it (docs/spec/fingerprint.md
   * §8's digest): resolves to the descriptor readers get (`fd` is closed then), the digests and
   * where they were hashed (cuda: where the rank's fill hashed, ServedRankData.digestOn).
   * E_UPDATE_MAPPED (host) while the writer still maps it writable: nothing changed, commit again.
   */
  commit(service: RankService, fd: number, bytes: number, ranges: { start: number; end: number }[]): Promise<{ fd: number; digests: string[]; hashedOn: 'gpu' | 'cpu' }>;
}

const procPath = (fd: number) => `/proc/self/fd/${fd}`;
/** Threads that digest a publish (it is one engine's processed parameters, a fraction of a version). */
const DIGEST_THREADS = 2;
const packed = (ranges: { start: number; end: number }[]) => packTensorRanges(ranges.map((r) => ({ file: 0, ...r })));

const HOST: PublishBackend = {
  handle: 'fd',
  create: (_service, bytes, name) => addon().createWritableSegment(bytes, name),
  async commit(_service, fd, _bytes, ranges) {
    await addon().sealWritten(fd, 0, 'commit_publish');
    const digests = await addon().digestFiles([procPath(fd)], packed(ranges), DIGEST_THREADS);
    // Readers get a read-only open file of the sealed memfd, never the writer's.
    const readOnly = addon().openReadOnly(procPath(fd));
    addon().closeFd(fd);
    return { fd: readOnly, digests, hashedOn: 'cpu' };
  },
};

const CUDA: PublishBackend = {
  handle: 'cuda-fd',
  create(service, bytes) {
    refuseUnlessCudaFd(service);
    return addon().cudaStagingFresh(service.rank.device.index, bytes);
  },
  async commit(service, fd, bytes, ranges) {
    const { rank } = service;
    const committed = await addon().cudaCommitCopies(rank.device.index, [fd], [true], [bytes], packed(ranges), DIGEST_THREADS, rank.digestOn ?? DEFAULT_DIGESTS_ON);
    // The staging allocation goes (a writer that still maps it writes memory nobody reads).
    addon().closeFd(fd);
    return { fd: committed.fds[0]!, digests: committed.digests, hashedOn: committed.hashedOn };
  },
};

export const PUBLISH_BACKENDS: Record<Backend, PublishBackend> = { host: HOST, cuda: CUDA };

interface Publish {
  id: string;
  connectionId: number;
  pid: number;
  service: RankService;
  backend: PublishBackend;
  key: string;
  keyFields: Record<string, string>;
  tensors: TensorMeta[];
  bytes: number;
  /** The segment's descriptor once made; closed unless it became the layout's. */
  fd?: number;
  /** Settles once the begin reply that carries the descriptor was sent: it is not closed before. */
  sent: Promise<void>;
  markSent: () => void;
  committing: boolean;
}

export class PublishDesk {
  readonly #maxPercent: number;
  readonly #publishes = new Map<string, Publish>();

  /** `maxPercent`: --processed-max-percent, a rank's published bytes at most this percent of its version's bytes (0 refuses every publish). */
  constructor(maxPercent = DEFAULT_PROCESSED_MAX_PERCENT) {
    this.#maxPercent = maxPercent;
  }

  /** Whether a connection began a publish still in progress (kept open while idle, as an update's). */
  holds(connectionId: number): boolean {
    return [...this.#publishes.values()].some((p) => p.connectionId === connectionId);
  }

  /**
   * begin_publish on `service`'s rank: fresh memory for `tensors` (placed back to back, each
   * aligned), refused when `key` is published or being published, or past the cap. Returns the
   * writable descriptor and where each tensor lies.
   */
  async begin(
    service: RankService,
    request: { key: string; keyFields: Record<string, string>; tensors: readonly PublishTensor[] },
    caller: Caller,
    isConnected: () => boolean,
  ): Promise<{ id: string; fd: number; bytes: number; handle: string; tensors: TensorMeta[]; sent: () => void }> {
    const { rank } = service;
    const { key } = request;
    const backend = PUBLISH_BACKENDS[rank.backend];
    service.refuseUnlessServing();
    const published = service.processed.get(key);
    const inProgress = [...this.#publishes.values()].find((p) => p.service === service && p.key === key);
    if (published || inProgress) {
      throw new ServeError(
        'E_PUBLISHED',
        published
          ? `processed layout ${key} of model "${rank.name}" rank ${rank.globalRank} is published already: map it (get_processed) instead of publishing it again`
          : `processed layout ${key} of model "${rank.name}" rank ${rank.globalRank} is being published by another engine (pid ${inProgress!.pid}); map it (get_processed) once that one committed`,
        { model: rank.name, key },
      );
    }
    const beside = service.processed.size + [...this.#publishes.values()].filter((p) => p.service === service).length;
    if (beside >= PROCESSED_MAX_LAYOUTS) {
      throw new ServeError(
        'E_TOO_MANY_PUBLISHED',
        `model "${rank.name}" rank ${rank.globalRank} holds ${beside} processed layouts published or being published, the most one rank keeps (${PROCESSED_MAX_LAYOUTS}); ` +
          'the engine keeps processing at each start. An honest engine publishes one per engine version, kernel and architecture: look for a client publishing keys in a loop (/status lists each layout), or unload and load the model to clear them',
        { model: rank.name, key, layouts: beside, max: PROCESSED_MAX_LAYOUTS },
      );
    }
    const tensors = placeTensors(request.tensors);
    const bytes = tensors.length === 0 ? 0 : Math.max(...tensors.map((t) => t.offset + t.bytes));
    const cap = Math.floor((rank.segments.reduce((sum, s) => sum + s.bytes, 0) * this.#maxPercent) / 100);
    const held = service.processed.bytes + [...this.#publishes.values()].filter((p) => p.service === service).reduce((sum, p) => sum + p.bytes, 0);
    if (held + bytes > cap) {
      throw new ServeError(
        'E_OUT_OF_MEMORY',
        `publishing ${bytes} bytes of processed parameters for model "${rank.name}" rank ${rank.globalRank} would hold ${held + bytes} bytes beside the version, past its cap of ${cap} ` +
          `(--processed-max-percent ${this.#maxPercent} of its ${rank.segments.reduce((sum, s) => sum + s.bytes, 0)} bytes); the engine keeps processing at each start, or raise --processed-max-percent`,
        { model: rank.name, key, bytes, held, cap },
      );
    }
    let markSent = () => {};
    const sent = new Promise<void>((resolve) => (markSent = resolve));
    const publish: Publish = { id: randomBytes(16).toString('hex'), connectionId: caller.connectionId, pid: caller.pid, service, backend, key, keyFields: request.keyFields, tensors, bytes, sent, markSent, committing: false };
    this.#publishes.set(publish.id, publish);
    try {
      publish.fd = await backend.create(service, bytes, `weightd:processed:${rank.name}:r${rank.globalRank}:${key.slice(0, 8)}`);
    } catch (err) {
      publish.markSent(); // no reply carries it
      this.#end(publish);
      throw err;
    }
    if (!this.#publishes.has(publish.id) || !isConnected()) {
      publish.markSent();
      this.#end(publish);
      throw new ServeError('E_UPDATE_ABORTED', `the publish of processed layout ${key} of model "${rank.name}" ended while its memory was made (its connection closed); begin again`, { model: rank.name, key });
    }
    service.log.info({ model: rank.name, globalRank: rank.globalRank, key, keyFields: request.keyFields, bytes, tensors: tensors.length, peerPid: caller.pid }, 'publish begun: fresh memory handed to the engine');
    return { id: publish.id, fd: publish.fd, bytes, handle: backend.handle, tensors, sent: markSent };
  }

  /**
   * commit_publish: seals the memory (E_UPDATE_MAPPED while the engine still maps it writable:
   * unmap and commit again), digests every tensor and serves the layout beside its version.
   */
  async commit(id: string, caller: Caller): Promise<{ service: RankService; layout: ProcessedLayout }> {
    const publish = this.#publishes.get(id);
    if (!publish || publish.connectionId !== caller.connectionId || publish.committing) {
      throw new ServeError('E_NO_PUBLISH', `publish ${id.slice(0, 8)}… is not in progress on this connection: it was committed, ended with its connection, or begun on another connection; begin_publish again`);
    }
    const { service, backend } = publish;
    const { rank } = service;
    publish.committing = true;
    let committed: Awaited<ReturnType<PublishBackend['commit']>>;
    try {
      committed = await backend.commit(service, publish.fd!, publish.bytes, publish.tensors.map((t) => ({ start: t.offset, end: t.offset + t.bytes })));
    } catch (err) {
      publish.committing = false;
      // Still mapped writable: nothing changed, and the engine commits again once unmapped.
      if ((err as { code?: string }).code !== 'E_UPDATE_MAPPED' || !this.#publishes.has(id)) this.#end(publish);
      throw err;
    }
    publish.fd = committed.fd;
    const { digests } = committed;
    const layout: ProcessedLayout = { key: publish.key, keyFields: publish.keyFields, tensors: publish.tensors, segments: [{ segment: 0, bytes: publish.bytes, fd: committed.fd, handle: backend.handle }], digests, bytes: publish.bytes, publishedAt: Date.now() };
    if (!this.#publishes.has(id) || (service.status !== 'serving' && service.status !== 'draining') || !service.processed.add(layout)) {
      this.#end(publish);
      throw new ServeError('E_UPDATE_ABORTED', `the publish of processed layout ${publish.key} of model "${rank.name}" ended before it was committed (its connection closed, or the version was freed); nothing of it is kept`, { model: rank.name, key: publish.key });
    }
    // The layout owns the descriptor now.
    publish.fd = undefined;
    this.#publishes.delete(id);
    service.log.info({ model: rank.name, globalRank: rank.globalRank, key: publish.key, bytes: publish.bytes, tensors: publish.tensors.length, hashedOn: committed.hashedOn }, 'processed layout published: it serves beside its version');
    return { service, layout };
  }

  /** A connection ended: a publish it began and did not commit ends, leaving nothing (one being digested, once its commit sees it gone). */
  connectionClosed(connectionId: number): void {
    for (const p of [...this.#publishes.values()]) {
      if (p.connectionId !== connectionId) continue;
      if (p.committing) this.#publishes.delete(p.id);
      else this.#end(p);
    }
  }

  #end(publish: Publish): void {
    this.#publishes.delete(publish.id);
    // A descriptor on its way to the engine is closed once the send settled, never under it.
    void publish.sent.then(() => {
      if (publish.fd !== undefined) addon().closeFd(publish.fd);
      publish.fd = undefined;
    });
  }
}

/**
 * Places `tensors` one after another in one segment, each at a multiple of TENSOR_ALIGN; refuses
 * a dtype not in docs/spec/dtypes.md, a size that ends inside a byte, an empty tensor and a name
 * given twice, naming it.
 */
function placeTensors(tensors: readonly PublishTensor[]): TensorMeta[] {
  const seen = new Set<string>();
  let at = 0;
  return tensors.map(({ name, dtype, shape }) => {
    if (seen.has(name)) throw new ServeError('E_BAD_REQUEST', `begin_publish names tensor "${name}" twice; name each published tensor once`, { tensor: name });
    seen.add(name);
    if (!isDtype(dtype)) throw new ServeError('E_BAD_REQUEST', `begin_publish tensor "${name}" has dtype "${dtype}", which is not a safetensors dtype (docs/spec/dtypes.md)`, { tensor: name, dtype });
    const bits = tensorBits(dtype, shape);
    if (bits === 0n || bits % 8n !== 0n) {
      throw new ServeError('E_BAD_REQUEST', `begin_publish tensor "${name}" (${dtype} [${shape.join(', ')}]) is empty or ends inside a byte; publish whole, non-empty tensors`, { tensor: name });
    }
    const offset = Math.ceil(at / TENSOR_ALIGN) * TENSOR_ALIGN;
    // Past 2^53 bytes a number no longer counts them exactly; no memory holds that many.
    if (bits / 8n > BigInt(Number.MAX_SAFE_INTEGER - offset)) {
      throw new ServeError('E_BAD_REQUEST', `begin_publish tensor "${name}" (${dtype} [${shape.join(', ')}]) is ${bits / 8n} bytes, which no memory holds (the tensors up to it must stay under 2^53 bytes); check its shape`, { tensor: name });
    }
    const bytes = Number(bits / 8n);
    at = offset + bytes;
    return { name, dtype, shape: [...shape], segment: 0, offset, bytes };
  });
}
