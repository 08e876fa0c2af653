// The node's recent events: every event the supervisor, its model registry and each model actor handled (with
// the state it left and the state it reached) and every command each sent to a child actor, in
// the order they happened, fed by xstate's inspection API. It backs node.onEvent(), the /events stream, the error
// counters and the progress reporter's summaries.
import type { AnyActorRef, InspectionEvent, StateValue } from 'xstate';
import { errorCode } from '../errors.js';
import { stateName } from './stateName.js';

export interface NodeEvent {
  /** 1, 2, 3 ... in the order the events happened. */
  seq: number;
  /** Milliseconds since the epoch, when it was published: never earlier than the event before. */
  time: number;
  /** The event's type as the machine names it (xstate's own events included). */
  type: string;
  /** What an operator reads: "prepare done", "start rank-0", "stopTimeout passed", or the type. */
  label: string;
  /** The child actor (rank-0, serve-1, group, models ...) the supervisor, registry or model sent this to; absent for events it received. */
  to?: string;
  /** The model actor (model-0, load-1 ...) that handled or sent it; absent: the supervisor or its model registry. */
  model?: string;
  /** The model registry (src/models/modelRegistryMachine.ts) handled or sent it; absent with `model`: the supervisor. */
  registry?: true;
  /** The state of the actor that handled the event, after it (events it received). */
  state?: string;
  /** The state it left, when the event changed it. */
  from?: string;
  /** The event's fields, made safe to publish: see summarizeEvent. */
  data: Record<string, unknown>;
}

export type NodeEventListener = (event: NodeEvent) => void;

export const DEFAULT_FEED_CAPACITY = 256;

/** RANK_PROGRESS arrives every 20 ms per rank; the feed keeps one per rank per this interval. */
export const PROGRESS_SAMPLE_MS = 1000;

const MAX_STRING = 512;
const MAX_RANK_LIST = 64;

/** An event as an operator reads it: xstate's internal event names said in words. */
export function eventLabel(type: string, to?: string): string {
  if (type === 'xstate.init') return to === undefined ? 'start' : `start ${to}`;
  const m = /^xstate\.(done|error)\.actor\.(.+)$/.exec(type);
  if (m) return `${m[2]} ${m[1] === 'done' ? 'done' : 'failed'}`;
  const after = /^xstate\.after\.([^.]+)\./.exec(type);
  if (after) return `${after[1]} passed`;
  return type;
}

/**
 * An event's fields, safe to show on an HTTP page or in a log: numbers, booleans and short
 * strings as they are, errors as code and message, devices as their ids, short lists of numbers
 * (node ranks) as they are and other arrays as their length. Anything else is left out, in
 * particular segment exports: a CUDA IPC handle must only ever travel over the 0600 Unix socket,
 * never over TCP.
 */
export function summarizeEvent(event: { type: string } & Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(event)) {
    // actorId repeats what the label says ("prepare done").
    if (key === 'type' || key === 'actorId' || value === undefined) continue;
    if (typeof value === 'number' || typeof value === 'boolean') out[key] = value;
    else if (typeof value === 'string') out[key] = value.length > MAX_STRING ? `${value.slice(0, MAX_STRING)}…` : value;
    // Node ranks (joined, missing, lost) as they are; any other list as its length.
    else if (Array.isArray(value)) out[key] = value.length <= MAX_RANK_LIST && value.every((v) => typeof v === 'number') ? value : value.length;
    else if (key === 'error' && value !== null && typeof value === 'object') {
      const e = value as { message?: unknown; name?: unknown };
      out.error = { code: errorCode(value) ?? 'E_INTERNAL', name: String(e.name ?? 'Error'), message: String(e.message ?? value) };
    } else if ((key === 'info' || key === 'device') && value !== null && typeof value === 'object') {
      const d = value as Record<string, unknown>;
      out[key] = { backend: d.backend, index: d.index, uuid: d.uuid, name: d.name };
    }
  }
  return out;
}

/** An actor's depth below the root: 0 the root, undefined outside its tree. */
function depth(actor: AnyActorRef | undefined, rootId: string): number | undefined {
  for (let n = 0; actor; n++, actor = actor._parent) if (actor.sessionId === rootId) return n;
  return undefined;
}

/**
 * The supervisor (the root, depth 0), its model registry (its one child that is a machine: the
 * others are callbacks and promises) and each model actor (the registry's children that are
 * machines); not the machines a model runs (its ranks' serving lifecycles).
 */
function followed(actor: AnyActorRef, snapshot: unknown, rootId: string): boolean {
  const d = depth(actor, rootId);
  return d === 0 || ((d === 1 || d === 2) && (snapshot as { value?: unknown } | undefined)?.value !== undefined);
}

/** Who handled or sent an event, below the supervisor: its model registry, or a model actor by name. */
function actorOf(actor: AnyActorRef, rootId: string): { model?: string; registry?: true } {
  const d = depth(actor, rootId);
  return d === 2 ? { model: actor.id } : d === 1 ? { registry: true } : {};
}

export class EventFeed {
  readonly #capacity: number;
  readonly #events: NodeEvent[] = [];
  readonly #listeners = new Set<NodeEventListener>();
  /**
   * What happened while an actor (by its session id) handles an event: the commands it sent its
   * children and what other followed actors did with the events it sent them; published after it.
   */
  readonly #outboxes = new Map<string, Array<Omit<NodeEvent, 'seq' | 'time' | 'label'>>>();
  /** The actor (session id) that sent each event, while it handled one of its own. */
  readonly #causes = new WeakMap<object, string>();
  readonly #lastProgress = new Map<string, number>();
  /** Each followed actor's state, by its session id. */
  readonly #states = new Map<string, string>();
  #seq = 0;
  #lastTime = 0;

  constructor(capacity = DEFAULT_FEED_CAPACITY) {
    this.#capacity = capacity;
  }

  /**
   * Pass to createActor's `inspect` option. A command sent from an action is seen before the
   * snapshot of the event that caused it, and so is what another followed actor did with an event
   * it was sent meanwhile (a model's MODEL_SERVING handled by the supervisor, the supervisor's
   * MODEL_STOP by a model): each waits in the outbox of the actor whose event caused it until that
   * event is published, so the feed reads cause, then effects.
   */
  readonly inspect = (ev: InspectionEvent): void => {
    if (ev.type === '@xstate.event') {
      const source = ev.sourceRef as AnyActorRef | undefined;
      if (!source || !followed(source, source.getSnapshot(), ev.rootId)) return;
      // The source is handling an event of its own: what it sends is an effect of that.
      this.#causes.set(ev.event, source.sessionId);
      const outbox = this.#outbox(source.sessionId);
      // Commands only: what a followed actor sends its own children (not what a model tells the supervisor).
      if ((ev.actorRef as AnyActorRef)._parent?.sessionId === source.sessionId) {
        outbox.push({ type: ev.event.type, to: (ev.actorRef as AnyActorRef).id, ...actorOf(source, ev.rootId), data: summarizeEvent(ev.event) });
      }
      return;
    }
    const actor = ev.actorRef as AnyActorRef;
    if (ev.type !== '@xstate.snapshot' || !followed(actor, ev.snapshot, ev.rootId)) return;
    const value = (ev.snapshot as { value?: StateValue }).value;
    // A model stopped with the supervisor: the supervisor's own end is in the feed already.
    if (value === undefined || ev.event.type === 'xstate.stop') {
      this.#forget(actor, ev.rootId);
      return;
    }
    const state = stateName(value);
    const from = this.#states.get(actor.sessionId);
    this.#states.set(actor.sessionId, state);
    const event = ev.event as { type: string } & Record<string, unknown>;
    const by = actorOf(actor, ev.rootId);
    const batch: Array<Omit<NodeEvent, 'seq' | 'time' | 'label'>> = this.#keep(event, from !== state, by.model) ? [{ type: event.type, ...by, state, ...(from !== undefined && from !== state ? { from } : {}), data: summarizeEvent(event) }] : [];
    batch.push(...(this.#outboxes.get(actor.sessionId) ?? []));
    this.#outboxes.delete(actor.sessionId);
    const cause = this.#causes.get(event);
    const pending = cause === undefined ? undefined : this.#outboxes.get(cause);
    if (pending) pending.push(...batch);
    else for (const e of batch) this.#publish(e);
    if ((ev.snapshot as { status?: string }).status !== 'active') this.#forget(actor, ev.rootId);
  };

  /** How many actors the feed remembers a state of: those alive (an ended one is forgotten). */
  get followed(): number {
    return this.#states.size;
  }

  /**
   * An actor that ended is forgotten, with its model's progress samples: a daemon that loads and
   * unloads for months keeps no entry per model it ever had.
   */
  #forget(actor: AnyActorRef, rootId: string): void {
    this.#states.delete(actor.sessionId);
    const { model } = actorOf(actor, rootId);
    if (model !== undefined) for (const key of [...this.#lastProgress.keys()]) if (key.startsWith(`${model}/`)) this.#lastProgress.delete(key);
  }

  /** The outbox of the actor with this session id, which is handling an event now. */
  #outbox(sessionId: string): Array<Omit<NodeEvent, 'seq' | 'time' | 'label'>> {
    let outbox = this.#outboxes.get(sessionId);
    if (!outbox) this.#outboxes.set(sessionId, (outbox = []));
    return outbox;
  }

  /** Progress is sampled; every other event is kept. */
  #keep(event: { type: string } & Record<string, unknown>, changedState: boolean, model: string | undefined): boolean {
    if (event.type !== 'RANK_PROGRESS' || changedState) return true;
    const rank = `${model ?? ''}/${Number(event.localRank)}`;
    const now = Date.now();
    if (now - (this.#lastProgress.get(rank) ?? 0) < PROGRESS_SAMPLE_MS) return false;
    this.#lastProgress.set(rank, now);
    return true;
  }

  /**
   * Stamped here, in the order published, so time follows seq: a command is sent before the
   * event that caused it is published. A wall clock set back does not reorder them either.
   */
  #publish(e: Omit<NodeEvent, 'seq' | 'time' | 'label'>): void {
    this.#lastTime = Math.max(this.#lastTime, Date.now());
    const event: NodeEvent = { seq: ++this.#seq, time: this.#lastTime, label: eventLabel(e.type, e.to), ...e };
    this.#events.push(event);
    if (this.#events.length > this.#capacity) this.#events.shift();
    for (const listener of this.#listeners) {
      try {
        listener(event);
      } catch (err) {
        // This runs inside the machine's event processing, which a listener's bug must not
        // break; it surfaces as an uncaught exception instead, as xstate does for observers.
        queueMicrotask(() => {
          throw err;
        });
      }
    }
  }

  /** The events kept so far, oldest first. */
  recent(): NodeEvent[] {
    return this.#events.slice();
  }

  /** Calls `listener` for every event from now on; returns the unsubscribe function. */
  subscribe(listener: NodeEventListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}
