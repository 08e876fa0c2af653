// weightd ctl: one request to a running daemon's control socket (src/control/controlServer.ts),
// its reply printed. Exit codes: 0 done, 1 the daemon refused or failed it, 2 no daemon to ask.
import { readdirSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import type { ControlReply, ControlRequest } from '../control/controlProtocol.js';
import { CONTROL_FILE, MAX_CONTROL_REPLY_BYTES } from '../control/controlSocket.js';
import { UsageError } from '../errors.js';
import { CTL_COMMANDS } from './ctl/index.js';
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
  else out.write(CTL_COMMANDS[c.request.cmd].print(reply));
  return 0;
}
