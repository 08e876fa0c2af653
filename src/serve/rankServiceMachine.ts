// A rank's serving lifecycle: serving -> (draining ->) releasing -> released, and nothing else.
// draining: the model is being unloaded or superseded; no new lease is granted, and the memory
// is freed once the last lease has ended (or at once when the unload is forced).
//
// Written as an xstate machine rather than a hand-made table because the inspect page already
// draws xstate machines from their own definition (src/inspect/machineToMermaid.ts): this one
// can be drawn beside the supervisor with no second drawing code, and cannot drift from it.
// It is not run as an actor. RankService steps it with xstate's pure `transition()`: every
// request reads the state synchronously, and a running actor would silently drop an event its
// state does not take, where a wrong transition here must fail loudly (rankServiceStep).
// It imports no I/O (errors.ts and types only), so a module that draws or spawns it loads none.
import { initialTransition, setup, transition, type SnapshotFrom } from 'xstate';
import { ServeError } from '../errors.js';

export type RankServiceEvent =
  /** A client's release passed the lease check: no new lease from here on. */
  | { type: 'RELEASE_ALLOWED' }
  /** The model is unloaded (or a newer version took its place): no new lease, the held ones stay. */
  | { type: 'DRAIN' }
  | { type: 'MEMORY_FREED' }
  /** Whether any memory is left is unknown: it is never handed out again either. */
  | { type: 'FREEING_FAILED' };

export const rankServiceMachine = setup({ types: { events: {} as RankServiceEvent } }).createMachine({
  id: 'rankService',
  initial: 'serving',
  states: {
    serving: { on: { RELEASE_ALLOWED: 'releasing', DRAIN: 'draining' } },
    draining: { on: { RELEASE_ALLOWED: 'releasing' } },
    releasing: { on: { MEMORY_FREED: 'released', FREEING_FAILED: 'released' } },
    released: { type: 'final' },
  },
});

export type RankServiceSnapshot = SnapshotFrom<typeof rankServiceMachine>;

export function rankServiceStart(): RankServiceSnapshot {
  return initialTransition(rankServiceMachine)[0];
}

/** The next state; an event the current state does not take is a bug in weightd, and throws. */
export function rankServiceStep(snapshot: RankServiceSnapshot, event: RankServiceEvent, rankName: string): RankServiceSnapshot {
  if (!snapshot.can(event)) {
    throw new ServeError(
      'E_ILLEGAL_TRANSITION',
      `${rankName}'s serving lifecycle got ${event.type} while ${snapshot.value}, which it does not take there; this is a bug in weightd, please report it`,
      { state: snapshot.value, event: event.type },
    );
  }
  return transition(rankServiceMachine, snapshot, event)[0];
}
