// In-process rendezvous groups on loopback: node 0's Coordinator and one GroupMember per node,
// each recording the GroupEvents it emits, with short clocks so failure paths take
// milliseconds. Ports are picked by the kernel (port 0) so test files can run in parallel.
import { connect, type Socket } from 'node:net';
import pino from 'pino';
import { GroupMember, type JoinRequest } from '../../src/rendezvous/groupMember.js';
import { Coordinator } from '../../src/rendezvous/coordinatorServer.js';
import type { GroupEvent } from '../../src/rendezvous/groupEvents.js';
import type { GroupTiming } from '../../src/rendezvous/timing.js';
import { encodeRdzvMessage, parseServerMessage, type AnyMessage, type ServerMessage } from '../../src/rendezvous/groupMessages.js';
import { createRdzvDecoder } from '../../src/rendezvous/groupMessages.js';

// Short, but with a peer timeout that a busy CI machine's event-loop stalls do not reach.
export const FAST: GroupTiming = { heartbeatMs: 50, peerTimeoutMs: 1000, retryMinMs: 10, retryMaxMs: 100, handshakeMs: 1000, joinMs: 1000 };
export const FINGERPRINT = 'a'.repeat(64);
export const silent = pino({ level: process.env.WEIGHTD_TEST_LOG ?? 'silent' });

export interface GroupShape {
  nnodes: number;
  localWorldSize: number;
  token?: string;
  rendezvousTimeoutMs?: number;
  /** The coordinator's clocks, over FAST. */
  timing?: Partial<GroupTiming>;
}

export function joinRequest(shape: GroupShape, nodeRank: number, over: Partial<JoinRequest> = {}): JoinRequest {
  return {
    nnodes: shape.nnodes,
    tpSize: shape.nnodes * shape.localWorldSize,
    localWorldSize: shape.localWorldSize,
    nodeRank,
    hostName: `host${nodeRank}`,
    deviceUuids: Array.from({ length: shape.localWorldSize }, (_, i) => `dev-${nodeRank}-${i}`),
    visibleDevices: shape.localWorldSize,
    fingerprint: FINGERPRINT,
    ...over,
  };
}

/** Everything a test opened, so that a test failing half-way leaves no socket to keep the process alive. */
const opened = new Set<{ close(): void }>();

/** Closes whatever the last test left open; every network test file runs it after each test. */
export function closeLeftovers(): void {
  for (const o of opened) o.close();
  opened.clear();
}

export async function startCoordinator(shape: GroupShape, port = 0): Promise<Coordinator> {
  return track(await Coordinator.listen({
    host: '127.0.0.1',
    port,
    expect: { nnodes: shape.nnodes, tpSize: shape.nnodes * shape.localWorldSize, localWorldSize: shape.localWorldSize, fingerprint: FINGERPRINT, token: shape.token },
    rendezvousTimeoutMs: shape.rendezvousTimeoutMs ?? 5000,
    timing: { ...FAST, ...shape.timing },
    log: silent,
  }));
}

export function track<T extends { close(): void }>(thing: T): T {
  opened.add(thing);
  return thing;
}

/** One node's client and everything it emitted: events, and the `msg` of each log line. */
export class TestNode {
  /** What it emitted, but the rendezvous progress (GROUP_WAITING), which is in `waiting`. */
  readonly events: GroupEvent[] = [];
  readonly waiting: Array<Extract<GroupEvent, { type: 'GROUP_WAITING' }>> = [];
  readonly logs: string[] = [];
  readonly client: GroupMember;
  #waiters: Array<() => void> = [];

  constructor(port: number, join: JoinRequest, opts: { token?: string; rendezvousTimeoutMs?: number; timing?: Partial<GroupTiming> } = {}) {
    this.client = new GroupMember({
      host: '127.0.0.1',
      port,
      token: opts.token,
      join,
      rendezvousTimeoutMs: opts.rendezvousTimeoutMs ?? 5000,
      timing: { ...FAST, ...opts.timing },
      // Its log lines are events too: "joined the group ... waiting", "retrying", ...
      log: pino({ level: 'debug' }, {
        write: (line: string) => {
          this.logs.push(String((JSON.parse(line) as { msg?: string }).msg));
          this.#wake();
        },
      }),
      emit: (e) => {
        if (e.type === 'GROUP_WAITING') this.waiting.push(e);
        else this.events.push(e);
        this.#wake();
      },
    });
    track(this.client).start();
  }

  types(): string[] {
    return this.events.map((e) => (e.type === 'PEER_LOST' || e.type === 'PEER_BACK' ? `${e.type}:${e.nodeRank}` : e.type));
  }

  /** Resolves with the first event matching `pred`; rejects after `ms`, listing what came. */
  next<T extends GroupEvent['type']>(type: T, ms = 5000, pred: (e: Extract<GroupEvent, { type: T }>) => boolean = () => true): Promise<Extract<GroupEvent, { type: T }>> {
    return this.#until(type, ms, () => this.events.find((e): e is Extract<GroupEvent, { type: T }> => e.type === type && pred(e as Extract<GroupEvent, { type: T }>)));
  }

  /** Resolves once this node has logged a line whose msg matches (e.g. that it joined and waits). */
  async logged(pattern: RegExp, ms = 5000): Promise<void> {
    await this.#until(String(pattern), ms, () => this.logs.find((m) => pattern.test(m)));
  }

  async #until<T>(what: string, ms: number, find: () => T | undefined): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const hit = find();
      if (hit !== undefined) return hit;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${what} within ${ms} ms; got: ${JSON.stringify(this.types())}, log: ${JSON.stringify(this.logs.slice(-5))}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.#waiters.push(() => (clearTimeout(t), resolve()));
      });
    }
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  failure(): { code: string; message: string } {
    const f = this.events.find((e) => e.type === 'GROUP_FAILED');
    if (!f || f.type !== 'GROUP_FAILED') throw new Error(`no GROUP_FAILED; got ${JSON.stringify(this.types())}`);
    return f.error;
  }
}

export function startNodes(port: number, shape: GroupShape, ranks: number[], over: (r: number) => Partial<JoinRequest> = () => ({})): TestNode[] {
  return ranks.map((r) => new TestNode(port, joinRequest(shape, r, over(r)), { token: shape.token, rendezvousTimeoutMs: shape.rendezvousTimeoutMs }));
}

/** Forms a group of `shape.nnodes` nodes and brings it to group-ready. */
export async function readyGroup(shape: GroupShape): Promise<{ coordinator: Coordinator; nodes: TestNode[] }> {
  const coordinator = await startCoordinator(shape);
  const nodes = startNodes(coordinator.port, shape, [...Array(shape.nnodes).keys()]);
  for (const n of nodes) await n.next('GROUP_JOINED');
  for (const n of nodes) n.client.nodeReady();
  for (const n of nodes) await n.next('GROUP_READY');
  return { coordinator, nodes };
}

export function closeAll(coordinator: Coordinator | undefined, nodes: TestNode[]): void {
  for (const n of nodes) n.client.close();
  coordinator?.close();
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A raw connection, for peers that misbehave on purpose. */
export class RawPeer {
  readonly socket: Socket;
  readonly received: ServerMessage[] = [];
  readonly closed: Promise<void>;
  readonly #decoder = createRdzvDecoder();

  constructor(port: number) {
    this.socket = connect({ host: '127.0.0.1', port });
    this.socket.on('data', (chunk: Buffer) => {
      for (const payload of this.#decoder.push(chunk)) this.received.push(parseServerMessage(payload));
    });
    this.socket.on('error', () => {});
    track(this);
    this.closed = new Promise((resolve) => this.socket.once('close', () => resolve()));
  }

  async hello(): Promise<Extract<ServerMessage, { type: 'hello' }>> {
    for (let i = 0; i < 200; i++) {
      const h = this.received.find((m) => m.type === 'hello');
      if (h && h.type === 'hello') return h;
      await sleep(5);
    }
    throw new Error('no hello');
  }

  send(message: AnyMessage | Record<string, unknown>): void {
    this.socket.write(encodeRdzvMessage(message as AnyMessage));
  }

  close(): void {
    this.socket.destroy();
  }
}
