// A rank actor: owns one worker thread that owns one device. Turns the worker's messages, errors
// and exit into supervisor events; stopping the actor terminates the thread, which frees the
// device. Which module the thread runs is its input: src/actors/rankWorker.ts from the
// composition root (src/actors/nodeActors.ts), a fixture that fails on purpose in tests.
import { Worker } from 'node:worker_threads';
import { fromCallback } from 'xstate';
import { serializeError } from '../errors.js';
import type { RankActorInput, RankCommand, RankEvent } from '../models/rankContract.js';
import type { MainToRank, RankToMain } from '../models/rankMessages.js';

const toWorker: Record<RankCommand['type'], MainToRank> = {
  RANK_RELEASE: { type: 'RELEASE' },
  RANK_STOP: { type: 'STOP' },
  RANK_ADMIT: { type: 'ADMIT' },
  RANK_KEEP: { type: 'KEEP' },
  RANK_UNKEEP: { type: 'UNKEEP' },
  RANK_KEEP_AGAIN: { type: 'KEEP_AGAIN' },
};

export const rankActor = fromCallback<RankCommand, RankActorInput, RankEvent>(({ input, sendBack, receive }) => {
  const { localRank } = input.workerData;
  const log = input.log;
  const worker = new Worker(input.worker, { workerData: input.workerData, name: `weightd-rank-${localRank}` });
  input.workers.track(worker);
  let stopRequested = false;
  let failed = false;
  const fail = (error: ReturnType<typeof serializeError>) => {
    if (failed) return;
    failed = true;
    sendBack({ type: 'RANK_FAILED', localRank, error });
  };

  worker.on('message', (m: RankToMain) => {
    switch (m.type) {
      case 'DEVICE':
        sendBack({ type: 'RANK_DEVICE', localRank, info: m.info, ...(m.adoptable ? { adoptable: true } : {}) });
        break;
      case 'PROGRESS':
        sendBack({ type: 'RANK_PROGRESS', localRank, bytes: m.bytes, totalBytes: m.totalBytes, seconds: m.seconds });
        break;
      case 'LOADED':
        sendBack({ type: 'RANK_LOADED', localRank, device: m.info, segments: m.segments, bytes: m.bytes, seconds: m.seconds, source: m.source, digests: m.digests });
        break;
      case 'KEPT':
        sendBack({ type: 'RANK_KEPT', localRank, kept: m.kept, reason: m.reason });
        break;
      case 'RELEASED':
        sendBack({ type: 'RANK_RELEASED', localRank });
        break;
      case 'FAILED':
        fail(m.error);
        break;
      case 'LOG':
        log[m.level](m.fields ?? {}, m.msg);
        break;
    }
  });
  worker.on('error', (err) => fail(serializeError(err)));
  worker.on('exit', (code) => {
    if (stopRequested && code === 0) sendBack({ type: 'RANK_STOPPED', localRank });
    else fail({ name: 'RankFailedError', code: 'E_RANK_EXIT', message: `worker thread exited with code ${code}` });
  });

  receive((cmd) => {
    if (cmd.type === 'RANK_STOP') stopRequested = true;
    worker.postMessage(toWorker[cmd.type]);
  });

  return () => {
    // Runs when the supervisor stops this actor (stop, failure, or final state). A worker that
    // already ended makes terminate() a no-op; one still running is ended, and its addon frees
    // the device at teardown. WorkerRegistry lets the node wait for that.
    stopRequested = true;
    void worker.terminate();
  };
});
