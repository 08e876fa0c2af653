// Real weightd processes (`node dist/main.js --device host`), one per simulated node, on a Fabric
// (network namespaces or loopback). Each node gets its own host device ids (WEIGHTD_HOST_DEVICES)
// and socket directory; stderr is kept line by line so tests can wait for log lines.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient, type Attached, type HostTensor } from '../../src/client/index.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { DEFAULT_GROUP_TIMING } from '../../src/rendezvous/timing.js';
import type { Fabric } from '../helpers/netns.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { mainJs, repoRoot } from '../helpers/paths.js';

export const fixtures = `${repoRoot}dist/test/rendezvous/fixtures`;

/**
 * Quick retries. The peer timeout is long: a killed node's connections close, and that event is
 * what these tests wait for; a short timeout would only let a stall of a busy machine's scheduler
 * pass for a lost peer. Only the frozen-node test (`frozenPeerEnv`) needs the timeout itself.
 */
const FAST_ENV = {
  WEIGHTD_RDZV_HEARTBEAT_MS: '200',
  WEIGHTD_RDZV_PEER_TIMEOUT_MS: '120000',
  WEIGHTD_RDZV_RETRY_MIN_MS: '50',
  WEIGHTD_RDZV_RETRY_MAX_MS: '300',
};

/**
 * For the one test of the peer timeout: a SIGSTOPped node keeps its connections open, so only
 * the timeout finds it. The daemon's default, with FAST_ENV's 200 ms heartbeats.
 */
export const frozenPeerEnv = { WEIGHTD_RDZV_PEER_TIMEOUT_MS: String(DEFAULT_GROUP_TIMING.peerTimeoutMs) };

export interface NodeSpec {
  nodeRank: number;
  nnodes?: number;
  tp?: number;
  /** WEIGHTD_HOST_DEVICES; default two per node, named after the node rank. */
  devices?: string[];
  model?: string;
  token?: string;
  timeoutS?: number;
  /** Run test/rendezvous/fixtures/faultyNode.js with these variables instead of dist/main.js. */
  faulty?: { WEIGHTD_TEST_KILL_AT?: string; WEIGHTD_TEST_FAULT?: string; WEIGHTD_TEST_MODEL_SCENARIO?: string };
  /** The fabric node (namespace) to run on; default the node rank. A misconfigured spare runs elsewhere. */
  on?: number;
}

export interface LogLine {
  msg?: string;
  code?: string;
  level?: number;
  [key: string]: unknown;
}

export class Daemon {
  readonly lines: string[] = [];
  readonly exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly #child: ChildProcess;
  #listeners: Array<() => void> = [];

  /** `socketDir`: its --weight-cache-socket-dir (its control socket is there too). */
  constructor(readonly spec: Required<Pick<NodeSpec, 'nodeRank'>> & NodeSpec, argv: string[], env: NodeJS.ProcessEnv, readonly socketDir = '') {
    this.#child = spawn(argv[0]!, argv.slice(1), { env, stdio: ['ignore', 'ignore', 'pipe'] });
    let rest = '';
    this.#child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      const parts = (rest + chunk).split('\n');
      rest = parts.pop()!;
      this.lines.push(...parts);
      for (const l of this.#listeners.splice(0)) l();
    });
    this.exit = new Promise((resolve) => this.#child.on('exit', (code, signal) => {
      if (rest) this.lines.push(rest);
      for (const l of this.#listeners.splice(0)) l();
      resolve({ code, signal });
    }));
  }

  get pid(): number {
    return this.#child.pid!;
  }

  get exited(): boolean {
    return this.#child.exitCode !== null || this.#child.signalCode !== null;
  }

  logs(): LogLine[] {
    return this.lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as LogLine);
  }

  /** The first line (parsed when JSON) that matches; rejects after `ms` with this node's log tail. */
  async waitFor(what: string, match: (line: string, log: LogLine | undefined) => boolean, ms = 15_000, since = 0): Promise<LogLine> {
    const until = Date.now() + ms;
    for (let seen = since; ; ) {
      for (; seen < this.lines.length; seen++) {
        const line = this.lines[seen]!;
        const log = line.startsWith('{') ? (JSON.parse(line) as LogLine) : undefined;
        if (match(line, log)) return log ?? { msg: line };
      }
      const left = until - Date.now();
      if (left <= 0 || this.exited) {
        throw new Error(`node ${this.spec.nodeRank} (pid ${this.pid}): no ${what} within ${ms} ms${this.exited ? ' (it exited)' : ''}; log tail:\n${this.lines.slice(-12).join('\n')}`);
      }
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.min(left, 500));
        this.#listeners.push(() => (clearTimeout(t), resolve()));
      });
    }
  }

  /** A log line whose msg matches, among the lines from index `since` (see `mark`). */
  waitForMsg(pattern: RegExp, since = 0, ms?: number): Promise<LogLine> {
    return this.waitFor(String(pattern), (_l, log) => pattern.test(log?.msg ?? ''), ms, since);
  }

  /** Where the log is now: pass to waitForMsg to wait only for what comes after. */
  mark(): number {
    return this.lines.length;
  }

  /** The READY line, then the group-ready line: this node serves and so does every other. */
  async groupReady(ms?: number): Promise<void> {
    await this.waitFor('READY line', (_, log) => log?.msg?.startsWith(`READY node ${this.spec.nodeRank}/`) === true, ms);
    await this.waitForMsg(/^group ready: every node is serving$/, 0, ms);
  }

  /** The node exits 1, and its final error line (the node's failure) carries `code` and matches `message`. */
  async failsWith(code: string, message: RegExp, ms = 20_000): Promise<LogLine> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_r, reject) => {
      timer = setTimeout(() => reject(new Error(`node ${this.spec.nodeRank} did not exit within ${ms} ms; log tail:\n${this.lines.slice(-12).join('\n')}`)), ms);
    });
    const { code: rc } = await Promise.race([this.exit, timeout]).finally(() => clearTimeout(timer));
    const last = this.logs().filter((l) => l.level === 50).at(-1);
    if (last?.code !== code || !message.test(String(last.msg))) {
      throw new Error(`node ${this.spec.nodeRank}: expected a final ${code} error matching ${message}, got ${last?.code}: ${last?.msg}\nlog tail:\n${this.lines.slice(-12).join('\n')}`);
    }
    if (rc !== 1) throw new Error(`node ${this.spec.nodeRank} exited with ${rc}, expected 1`);
    return last;
  }

  /** The socket path of each local rank, from its "serving" lines. */
  socketPaths(): string[] {
    return this.logs().filter((l) => l.msg === 'serving' && typeof l.socket === 'string').map((l) => l.socket as string);
  }

  /** Pings every local rank's socket: proof that this node still serves. */
  async pingAll(): Promise<number[]> {
    const ranks: number[] = [];
    for (const path of new Set(this.socketPaths())) {
      const c = await WeightdClient.connect(path, { timeoutMs: 5000 });
      try {
        ranks.push((await c.ping()).rank.globalRank);
      } finally {
        c.close();
      }
    }
    return ranks;
  }

  kill(signal: NodeJS.Signals): void {
    if (!this.exited) this.#child.kill(signal);
  }
}

export class Cluster {
  readonly daemons: Daemon[] = [];
  readonly #dir = mkdtempSync(join(tmpdir(), 'weightd-cluster-'));

  constructor(readonly fabric: Fabric, readonly port: number, readonly shape: { nnodes: number; tp: number; timeoutS: number; model: string; env?: Record<string, string> }) {}

  start(spec: NodeSpec): Daemon {
    const nnodes = spec.nnodes ?? this.shape.nnodes;
    const tp = spec.tp ?? this.shape.tp;
    const devices = spec.devices ?? Array.from({ length: tp / nnodes }, (_, i) => `node${spec.nodeRank}-dev${i}`);
    const socketDir = mkdtempSync(join(this.#dir, `n${spec.nodeRank}-`));
    const args = [
      '--model', spec.model ?? this.shape.model, '--device', 'host', '--tensor-parallel-size', String(tp), '--nnodes', String(nnodes),
      '--node-rank', String(spec.nodeRank), '--master-addr', this.fabric.addr(0), '--weight-cache-master-port', String(this.port),
      '--weight-cache-socket-dir', socketDir, '--rendezvous-timeout', String(spec.timeoutS ?? this.shape.timeoutS),
      ...(spec.token ? ['--weight-cache-token', spec.token] : []),
    ];
    const script = spec.faulty ? `${fixtures}/faultyNode.js` : mainJs;
    const env = { ...process.env, ...FAST_ENV, ...this.shape.env, WEIGHTD_HOST_DEVICES: devices.join(','), ...spec.faulty };
    const d = new Daemon({ ...spec, nodeRank: spec.nodeRank }, this.fabric.wrap(spec.on ?? spec.nodeRank, [process.execPath, script, ...args]), env, socketDir);
    this.daemons.push(d);
    return d;
  }

  /** Runs a fixture script on node `i` of the fabric. */
  run(i: number, script: string, args: string[]): Daemon {
    const d = new Daemon({ nodeRank: -1 }, this.fabric.wrap(i, [process.execPath, `${fixtures}/${script}`, ...args]), process.env);
    this.daemons.push(d);
    return d;
  }

  /** Stops every process still running (SIGTERM, then SIGKILL after 5 s), then removes its files. */
  async close(): Promise<void> {
    for (const d of this.daemons) d.kill('SIGTERM');
    const hard = setTimeout(() => this.daemons.forEach((d) => d.kill('SIGKILL')), 5000);
    await Promise.all(this.daemons.map((d) => d.exit));
    clearTimeout(hard);
    // Nothing else to remove: a daemon's segments are memfds, gone with the process, SIGKILL too.
    rmSync(this.#dir, { recursive: true, force: true });
  }
}

/**
 * Two small Llama checkpoints whose dimensions divide by 2, 3, 4, 6 and 8 (tiny-llama's 8 heads
 * cannot be split 3 ways): `model`, and `other`, one layer more, so its fingerprint differs.
 */
export async function e2eModels(): Promise<{ model: string; other: string; remove: () => void }> {
  const root = mkdtempSync(join(tmpdir(), 'weightd-e2e-models-'));
  const dims = { hidden: 96, heads: 24, kvHeads: 24, headDim: 4, intermediate: 192, vocab: 384, layers: 2 };
  const model = join(root, 'model');
  const other = join(root, 'other');
  mkdirSync(model);
  mkdirSync(other);
  await writeArchCheckpoint(model, 'LlamaForCausalLM', dims);
  await writeArchCheckpoint(other, 'LlamaForCausalLM', { ...dims, layers: 3 });
  return { model, other, remove: () => rmSync(root, { recursive: true, force: true }) };
}

/**
 * Attaches node `d`'s rank (global rank = its node rank, tp 2 over 2 nodes) to the version of
 * `dir`, and checks every byte; detaches, not releases (a release frees the daemon's cache of it).
 */
export async function assertServes(d: Daemon, dir: string, what: string): Promise<void> {
  const rank = d.spec.nodeRank;
  const client = await WeightdClient.connect(d.socketPaths()[0]!, { timeoutMs: 10_000 });
  try {
    const a = await client.attach(await expectedFingerprint(dir, 2, rank));
    assert.is(a.status, 'attached', `${what}: node ${rank} serves it`);
    for (const [name, e] of expectedRank(dir, 2, rank)) {
      const t = (a as Attached).tensors[name] as HostTensor;
      assert.ok(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).equals(e.bytes), `${what}: node ${rank}'s ${name} holds its bytes`);
    }
    await (a as Attached).detach();
  } finally {
    client.close();
  }
}
