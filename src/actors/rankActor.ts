// A rank actor: owns one worker thread that owns one device. Turns the worker's messages, errors
// and exit into supervisor events; stopping the actor terminates the thread, which frees the
// device. Which module the thread runs is its input: src/actors/rankWorker.ts from the
// composition root (src/actors/nodeActors.ts), a fixture that fails on purpose in tests.
// A rank that can adopt its kept shard with no worker (a restart's fast path, adoptHere.ts) tries
// that first, and starts its worker only when there is nothing to adopt; a version a writer just
// committed (host, or cuda with descriptors) adopts with no worker at all (adoptWrittenHere).
import { fromCallback } from 'xstate';
import { serializeError } from '../errors.js';
import type { RankActorInput, RankCommand, RankEvent } from '../models/rankContract.js';
import type { MainToRank, RankToMain, RankWorkerData } from '../models/rankMessages.js';
import { adoptHere, adoptsHere, adoptsWrittenHere, adoptWrittenHere } from './adoptHere.js';

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
  let stopRequested = false;
  let failed = false;
  const fail = (error: ReturnType<typeof serializeError>) => {
    if (failed) return;
    failed = true;
    sendBack({ type: 'RANK_FAILED', localRank, error });
  };

  const onMessage = (m: RankToMain) => {
    switch (m.type) {
      case 'DEVICE':
        sendBack({ type: 'RANK_DEVICE', localRank, info: m.info, ...(m.adoptable ? { adoptable: true } : {}) });
        break;
      case 'PROGRESS':
        sendBack({ type: 'RANK_PROGRESS', localRank, bytes: m.bytes, totalBytes: m.totalBytes, seconds: m.seconds, waitingForGroup: m.waitingForGroup });
        break;
      case 'LOADED':
        sendBack({ type: 'RANK_LOADED', localRank, device: m.info, segments: m.segments, bytes: m.bytes, seconds: m.seconds, source: m.source, digests: m.digests, ...(m.descriptors ? { descriptors: m.descriptors } : {}) });
        break;
      case 'DESCRIPTORS_CHECKED':
        sendBack({ type: 'RANK_DESCRIPTORS_CHECKED', localRank, ...(m.info ? { info: m.info } : {}), ...(m.error ? { error: m.error } : {}) });
        break;
      case 'KEPT':
        sendBack({ type: 'RANK_KEPT', localRank, kept: m.kept, reason: m.reason, ...(m.currentSince !== undefined ? { currentSince: m.currentSince } : {}) });
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
  };

  /** Where commands go once the rank runs (a worker, or the machine here); until then they wait in order. */
  let send: ((m: MainToRank) => void) | undefined;
  const waiting: MainToRank[] = [];
  let end = () => {};

  const startWorker = (keeperAsked?: RankWorkerData['keeperAsked']) => {
    const workerData = keeperAsked === undefined ? input.workerData : { ...input.workerData, keeperAsked };
    const { worker, warm } = input.workers.start(input.worker, workerData);
    log.debug({ localRank, warm }, `rank ${input.workerData.globalRank}: worker thread started${warm ? ' (warm: it loaded its modules while the node planned)' : ''}`);
    worker.on('message', onMessage);
    worker.on('error', (err) => fail(serializeError(err)));
    worker.on('exit', (code) => {
      if (stopRequested && code === 0) sendBack({ type: 'RANK_STOPPED', localRank });
      else fail({ name: 'RankFailedError', code: 'E_RANK_EXIT', message: `worker thread exited with code ${code}` });
    });
    // Its addon frees the device at teardown when it is terminated; WorkerRegistry lets the node wait for that.
    end = () => void worker.terminate();
    return (m: MainToRank) => worker.postMessage(m);
  };

  const nothingLoaded = (m: MainToRank) => {
    if (m.type === 'RELEASE') onMessage({ type: 'RELEASED' });
    if (m.type !== 'STOP') return;
    send = () => {};
    sendBack({ type: 'RANK_STOPPED', localRank });
  };

  const run = (to: (m: MainToRank) => void) => {
    send = to;
    for (const m of waiting.splice(0)) send(m);
  };

  if (adoptsHere(input.workerData)) {
    const stoppedHere = () => sendBack({ type: 'RANK_STOPPED', localRank });
    adoptHere(input.workerData, onMessage, stoppedHere).then(
      (here) => {
        if (here === undefined || 'refused' in here) {
          // A rank stopped meanwhile has nothing to free: no worker starts for it.
          if (end === noMore) return;
          // Told to stop while it asked: a worker would start only to stop. It holds nothing
          // (adoptHere freed its device), so it answers as a rank with nothing loaded.
          if (stopRequested) run(nothingLoaded);
          else run(startWorker(here ?? {}));
          return;
        }
        // Stopping the rank here frees its device (the machine's stopping), as a worker's exit would.
        if (end === noMore) here.send({ type: 'STOP' });
        else end = () => here.send({ type: 'STOP' });
        run(here.send);
      },
      (err: unknown) => fail(serializeError(err)),
    );
  } else if (adoptsWrittenHere(input.workerData)) {
    const here = adoptWrittenHere(input.workerData, onMessage, () => sendBack({ type: 'RANK_STOPPED', localRank }));
    // Stopping the rank here frees its device (the machine's stopping), as a worker's exit would.
    end = () => here.send({ type: 'STOP' });
    run(here.send);
  } else {
    run(startWorker());
  }

  receive((cmd) => {
    if (cmd.type === 'RANK_STOP') stopRequested = true;
    // A keep again may carry when the rank's version became current (RankKeeping.currentSince).
    const m = cmd.type === 'RANK_KEEP_AGAIN' && cmd.currentSince !== undefined ? { type: 'KEEP_AGAIN' as const, currentSince: cmd.currentSince } : toWorker[cmd.type];
    if (send) send(m);
    else waiting.push(m);
  });

  return () => {
    // Runs when the supervisor stops this actor (stop, failure, or final state): a rank still
    // running is ended, and its device freed.
    stopRequested = true;
    const ending = end;
    end = noMore;
    ending();
  };
});

/** The rank actor was stopped: whatever starts after that ends at once. */
const noMore = () => {};
