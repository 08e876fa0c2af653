// A rank's serving lifecycle takes exactly the transitions its machine declares: every other
// (state, event) pair throws, so a wrong wiring fails loudly instead of leaving the status wrong.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ServeError } from '../../src/errors.js';
import { ServeStatus } from '../../src/wire/protocol.js';
import { RankService } from '../../src/serve/rankService.js';
import { rankServiceMachine, rankServiceStart, rankServiceStep, type RankServiceEvent, type RankServiceSnapshot } from '../../src/serve/rankServiceMachine.js';
import type { ServedRankData } from '../../src/serve/servedRankData.js';

const EVENTS: RankServiceEvent['type'][] = ['RELEASE_ALLOWED', 'MEMORY_FREED', 'FREEING_FAILED'];
const LEGAL: Record<string, Record<string, string>> = {
  serving: { RELEASE_ALLOWED: 'releasing' },
  releasing: { MEMORY_FREED: 'released', FREEING_FAILED: 'released' },
  released: {},
};

function throwsIllegal(fn: () => unknown, where: string): void {
  try {
    fn();
  } catch (err) {
    assert.instance(err, ServeError, where);
    assert.is((err as ServeError).code, 'E_ILLEGAL_TRANSITION', where);
    return;
  }
  assert.unreachable(`${where}: no error`);
}

test('the states are the protocol statuses, serving first, released final', () => {
  assert.equal(Object.keys(rankServiceMachine.root.states), ServeStatus.options);
  assert.is(rankServiceStart().value, 'serving');
  assert.is(rankServiceMachine.root.states.released!.type, 'final');
});

test('every declared transition is taken; every other event throws E_ILLEGAL_TRANSITION', () => {
  const reach: Record<string, RankServiceSnapshot> = { serving: rankServiceStart() };
  reach.releasing = rankServiceStep(reach.serving!, { type: 'RELEASE_ALLOWED' }, 'rank 0');
  reach.released = rankServiceStep(reach.releasing!, { type: 'MEMORY_FREED' }, 'rank 0');
  for (const [state, snapshot] of Object.entries(reach)) {
    for (const type of EVENTS) {
      const target = LEGAL[state]![type];
      if (target) assert.is(rankServiceStep(snapshot, { type }, 'rank 0').value, target, `${state} + ${type}`);
      else throwsIllegal(() => rankServiceStep(snapshot, { type }, 'rank 0'), `${state} + ${type}`);
    }
  }
});

test('a second RankService.release() throws instead of freeing the memory twice', async () => {
  const rank = { globalRank: 3, device: { uuid: 'u', backend: 'host', index: 0, name: 'n' }, layouts: {}, segments: [] } as unknown as ServedRankData;
  let frees = 0;
  let finish!: () => void;
  const service = new RankService({ rank, log: pino({ level: 'silent' }), freeMemory: () => (frees++, new Promise<void>((resolve) => (finish = resolve))) });
  const first = service.release();
  throwsIllegal(() => service.release(), 'release while releasing');
  finish();
  await first;
  throwsIllegal(() => service.release(), 'release once released');
  assert.is(frees, 1);
  assert.is(service.status, 'released');
});

test.run();
