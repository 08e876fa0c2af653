// weightd ctl: one request to a running daemon's control socket (src/control/controlServer.ts),
// its reply printed. Exit codes: 0 done, 1 the daemon refused or failed it, 2 no daemon to ask.
import { readdirSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import type { ControlReply, ControlRequest } from '../control/controlProtocol.js';
import { CONTROL_FILE, MAX_CONTROL_REPLY_BYTES } from '../control/controlProtocol.js';
import { UsageError } from '../errors.js';
import type { LoadResult, ModelStatus, UnloadResult } from '../nodeStatus.js';
import { encodeFrame, FrameDecoder, parsePayload } from '../wire/frameCodec.js';
import { isProcessAlive, processIdentity } from '../wire/processLiveness.js';
import { defaultSocketDir } from '../wire/socketDir.js';

/** The control socket of the daemon that serves `socketDir`: the one whose process is alive. */
export function findControlSocket(socketDir = defaultSocketDir()): string {
  let names: string[];
  try {
    names = readdirSync(socketDir);
  } catch (err) {
    throw new UsageError('E_NO_CONTROL', `cannot read the socket directory ${socketDir} (${(err as NodeJS.ErrnoException).code}); is a weightd running there? Pass --weight-cache-socket-dir or --control`, { socketDir });
  }
  const live = names.filter((n) => {
    const [, pidText, kind] = CONTROL_FILE.exec(n) ?? [];
    if (kind !== 'sock') return false;
    const pid = Number(pidText);
    return pid > 0 && isProcessAlive(processIdentity(pid));
  });
  if (live.length === 1) return join(socketDir, live[0]!);
  if (live.length === 0) throw new UsageError('E_NO_CONTROL', `no running weightd has a control socket in ${socketDir}; start one, or pass --weight-cache-socket-dir or --control`, { socketDir });
  throw new UsageError('E_NO_CONTROL', `${live.length} daemons have control sockets in ${socketDir} (${live.join(', ')}); pass --control with the one you mean`, { sockets: live });
}

/** Sends one request and resolves with the daemon's reply. */
export function controlRequest(socketPath: string, request: ControlRequest): Promise<ControlReply> {
  return new Promise((resolve, reject) => {
    const socket = connect(socketPath);
    const decoder = new FrameDecoder(MAX_CONTROL_REPLY_BYTES);
    socket.on('connect', () => socket.write(encodeFrame(JSON.stringify(request))));
    socket.on('data', (chunk: Buffer) => {
      try {
        const [frame] = decoder.push(chunk);
        if (frame) {
          socket.destroy();
          resolve(parsePayload(frame) as ControlReply);
        }
      } catch (err) {
        socket.destroy();
        reject(err as Error);
      }
    });
    socket.on('error', (err: NodeJS.ErrnoException) => reject(new UsageError('E_NO_CONTROL', `cannot reach the control socket ${socketPath} (${err.code ?? err.message}); is the daemon running?`, { socket: socketPath })));
    socket.on('close', () => reject(new UsageError('E_NO_CONTROL', `the daemon closed ${socketPath} without answering`, { socket: socketPath })));
  });
}

/** What `ctl list` prints: one line per model version. */
export function formatModels(models: ModelStatus[]): string {
  const lines = models.map((m) => {
    const ranks = m.ranks.map((r) => `${r.globalRank}:${r.device?.uuid ?? '?'}`).join(' ');
    return `${m.name}${m.own ? ' (own)' : ''}  ${m.state}  tp=${m.tpSize}  ${(m.bytes / 2 ** 20).toFixed(1)} MiB  leases=${m.leases}  ${m.fingerprint?.slice(0, 16) ?? '?'}  ${m.model}  ranks ${ranks}`;
  });
  return `${lines.join('\n')}\n`;
}

/** What `ctl load` prints: what it evicted, then what it did. */
function formatLoad(r: LoadResult): string {
  const evicted = (r.evicted ?? []).map((e) => `evicted ${e.name}${e.own ? ' (own)' : ''} (fingerprint ${e.fingerprint.slice(0, 16)}, ${(e.bytes / 2 ** 20).toFixed(1)} MiB, last used ${e.lastUsedAt === undefined ? '?' : new Date(e.lastUsedAt).toISOString()})\n`);
  return evicted.join('') + (r.alreadyLoaded ? `${r.name} is already loaded (fingerprint ${r.fingerprint}): nothing to do\n` : `${r.name} loaded and serving (fingerprint ${r.fingerprint})\n`);
}

/** What `ctl unload` prints: one line per version it unloaded. */
function formatUnload(r: UnloadResult): string {
  return r.unloaded
    .map((u) => {
      const leases = `${u.leases} lease${u.leases === 1 ? '' : 's'}`;
      const when = r.force ? `freed now${u.leases > 0 ? `, ${leases} revoked` : ''}` : u.leases > 0 ? `draining: freed when its ${leases} end` : 'freed (no lease)';
      return `${u.name} (fingerprint ${u.fingerprint.slice(0, 16)}) unloaded: ${when}\n`;
    })
    .join('');
}

/** Text for a person, the same for every command; --json prints the daemon's reply as it came. */
export async function runCtl(c: { request: ControlRequest; control?: string; socketDir?: string; json: boolean }, out: NodeJS.WritableStream = process.stdout): Promise<number> {
  const socket = c.control ?? findControlSocket(c.socketDir);
  const reply = await controlRequest(socket, c.request);
  if (!reply.ok) {
    if (c.json) out.write(`${JSON.stringify(reply, null, 2)}\n`);
    process.stderr.write(`weightd ctl ${c.request.cmd}: ${reply.error.code}: ${reply.error.message}\n`);
    return 1;
  }
  if (c.json) out.write(`${JSON.stringify(reply, null, 2)}\n`);
  else if (c.request.cmd === 'list') out.write(formatModels(reply.models as ModelStatus[]));
  else if (c.request.cmd === 'load') out.write(formatLoad(reply as unknown as LoadResult));
  else out.write(formatUnload(reply as unknown as UnloadResult));
  return 0;
}
