// Simulated clusters for multi-node tests. A `Fabric` gives each node an address and a way to run
// a command "on" that node:
//  - netnsFabric: one network namespace per node, each with a veth pair plugged into a bridge
//    that lives in its own switch namespace, so the test never touches the host's network;
//    node i is 10.<subnet>.0.<i+1>/24 on eth0, and 127.0.0.1 inside a namespace is private.
//  - loopbackFabric: every node on this machine's 127.0.0.1, for machines without namespaces.
// Namespaces are named after the creating pid, so a crashed run's leftovers are recognised and
// removed by the next run.
import { isProcessAlive } from '../../src/wire/processLiveness.js';
import { execFileSync, spawnSync } from 'node:child_process';

export interface Fabric {
  readonly kind: 'netns' | 'loopback';
  readonly nodes: number;
  /** The address node i listens and is reached at. */
  addr(i: number): string;
  /** argv that runs `argv` on node i. */
  wrap(i: number, argv: string[]): string[];
  /** Removes everything the fabric created. Synchronous and idempotent, for `finally`. */
  close(): void;
}

const PREFIX = 'weightd-test-';

function ip(args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' });
  if (r.error || r.status !== 0) {
    throw new Error(`ip ${args.join(' ')} failed: ${(r.error?.message ?? r.stderr).trim() || `exit ${r.status}`}`);
  }
}

function listNamespaces(): string[] {
  const out = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  return out.status === 0 ? out.stdout.split('\n').map((l) => l.split(' ')[0]!).filter(Boolean) : [];
}

/** Deletes namespaces left by test processes that no longer run. */
function sweepStale(): void {
  for (const name of listNamespaces()) {
    const m = new RegExp(`^${PREFIX}(\\d+)-`).exec(name);
    if (m && !isProcessAlive({ pid: Number(m[1]) })) spawnSync('ip', ['netns', 'del', name]);
  }
}

let probed: string | null | undefined;

/**
 * Why network namespaces cannot be used here (null when they can): not root, no `ip`, or a
 * kernel/container that refuses `ip netns add`, veth or bridge devices. Probed once per process.
 */
export function netnsUnavailable(): string | null {
  if (probed !== undefined) return probed;
  if (process.platform !== 'linux') return (probed = `network namespaces need Linux (this is ${process.platform})`);
  if (process.getuid?.() !== 0) return (probed = 'network namespaces need root (ip netns add); run the suite as root, as CI does');
  let fabric: Fabric | undefined;
  try {
    execFileSync('ip', ['-V'], { stdio: 'ignore' });
    fabric = netnsFabric(1);
    probed = null;
  } catch (err) {
    probed = `cannot create network namespaces here: ${(err as Error).message.split('\n')[0]}`;
  } finally {
    fabric?.close();
  }
  return probed;
}

let fabricCount = 0;

/** `n` nodes, each in its own network namespace, joined by a bridge. Throws if `ip` refuses. */
export function netnsFabric(n: number): Fabric {
  sweepStale();
  const id = `${PREFIX}${process.pid}-${fabricCount++}`;
  // A different /24 per fabric of this process, so a leftover route can never alias another run's.
  const subnet = 10 + (fabricCount % 240);
  const sw = `${id}-sw`;
  const node = (i: number) => `${id}-n${i}`;
  const created: string[] = [];
  const fabric: Fabric = {
    kind: 'netns',
    nodes: n,
    addr: (i) => `10.${subnet}.0.${i + 1}`,
    wrap: (i, argv) => ['ip', 'netns', 'exec', node(i), ...argv],
    close() {
      for (const name of created.splice(0).reverse()) spawnSync('ip', ['netns', 'del', name]);
    },
  };
  try {
    ip(['netns', 'add', sw]);
    created.push(sw);
    ip(['-n', sw, 'link', 'add', 'br0', 'type', 'bridge']);
    ip(['-n', sw, 'link', 'set', 'br0', 'up']);
    for (let i = 0; i < n; i++) {
      ip(['netns', 'add', node(i)]);
      created.push(node(i));
      // Created straight into both namespaces: no interface ever appears in the host's.
      ip(['link', 'add', 'eth0', 'netns', node(i), 'type', 'veth', 'peer', 'name', `p${i}`, 'netns', sw]);
      ip(['-n', sw, 'link', 'set', `p${i}`, 'master', 'br0', 'up']);
      ip(['-n', node(i), 'addr', 'add', `${fabric.addr(i)}/24`, 'dev', 'eth0']);
      ip(['-n', node(i), 'link', 'set', 'eth0', 'up']);
      ip(['-n', node(i), 'link', 'set', 'lo', 'up']);
    }
  } catch (err) {
    fabric.close();
    throw err;
  }
  return fabric;
}

/** `n` nodes sharing this machine's loopback. */
export function loopbackFabric(n: number): Fabric {
  return { kind: 'loopback', nodes: n, addr: () => '127.0.0.1', wrap: (_i, argv) => argv, close() {} };
}
