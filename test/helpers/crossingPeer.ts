// A peer whose request crosses a listener's read deadline: a Python process (which, unlike a Node
// socket, can see that the daemon is done with it without reading what it was sent) sends a
// request's first 12 bytes, waits until the daemon's side is shut (POLLRDHUP: the refusal is
// written and no more will come), then sends the rest and reads the one reply frame. A listener
// that closed at once fails that send (EPIPE), and a Node client then loses the unread reply with
// its socket; one that ends drained (src/wire/turnAway.ts) lets it through.
import { spawn } from 'node:child_process';

const script = `
import select, socket, struct, sys, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
frame = bytes.fromhex(sys.argv[2])
s.sendall(frame[:12])
p = select.poll()
p.register(s, select.POLLRDHUP)
while not any(ev & select.POLLRDHUP for _, ev in p.poll()):
    pass
try:
    s.sendall(frame[12:])
    print("sent")
except OSError as e:
    print("send failed:", e)
head = s.recv(10, socket.MSG_WAITALL)
body = s.recv(struct.unpack(">I", head[6:10])[0], socket.MSG_WAITALL)
print(json.loads(body)["error"]["code"])
`;

/** Sends `frame` to the socket at `path` across its read deadline; resolves with what the peer printed: `sent\nCODE\n` when it was told why. */
export function crossReadDeadline(path: string, frame: Buffer): Promise<string> {
  const peer = spawn(process.env.WEIGHTD_PYTHON ?? 'python3', ['-c', script, path, frame.toString('hex')], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  peer.stdout.on('data', (d) => (out += d));
  peer.stderr.on('data', (d) => (out += d));
  return new Promise((resolve) => peer.on('close', () => resolve(out)));
}
