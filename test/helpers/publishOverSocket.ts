// Requests over a device socket as an engine sends them, for commands the TypeScript client does
// not speak (begin_publish, commit_publish, get_processed: docs/protocol.md). Descriptors a reply
// carries are dropped by the kernel, as a plain socket read takes no SCM_RIGHTS: what these tests
// need is the daemon's bookkeeping and memory, not the mapping.
import { connect } from 'node:net';
import { encodeMessage, FrameDecoder, MAX_RESPONSE_BYTES } from '../../src/wire/frameCodec.js';
import type { PublishTensor } from '../../src/wire/protocol.js';

type Message = Record<string, unknown>;

/** One connection to `socketPath`: `ask` sends a request and resolves to its reply (ok or refused). */
export async function socketAsker(socketPath: string): Promise<{ ask: (request: Message) => Promise<Message>; close: () => void }> {
  const socket = connect(socketPath);
  const decoder = new FrameDecoder(MAX_RESPONSE_BYTES);
  const replies: Message[] = [];
  let wake: (() => void) | undefined;
  socket.on('data', (chunk: Buffer) => {
    for (const frame of decoder.push(chunk)) replies.push(JSON.parse(frame.toString('utf8')));
    wake?.();
  });
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
  let id = 0;
  return {
    async ask(request) {
      socket.write(encodeMessage({ id: ++id, ...request }));
      while (replies.length === 0) await new Promise<void>((resolve) => (wake = resolve));
      return replies.shift()!;
    },
    close: () => socket.destroy(),
  };
}

/** Publishes `tensors` (left zero) under `key` beside version `base` of `model`; resolves to commit_publish's reply, or begin_publish's refusal. */
export async function publishOverSocket(socketPath: string, request: { model: string; base: string; key: string; tensors: PublishTensor[] }): Promise<Message> {
  const asker = await socketAsker(socketPath);
  try {
    const begun = await asker.ask({ cmd: 'begin_publish', keyFields: { protocol: 'processed-1', engine: 'test' }, ...request });
    if (begun.ok !== true) return begun;
    return await asker.ask({ cmd: 'commit_publish', publish: begun.publish });
  } finally {
    asker.close();
  }
}
