// Two connected in-memory streams: what one end writes, the other reads (Node 22's
// stream.duplexPair, which Node 20 lacks). Like a socket, an end that is ended or destroyed ends
// the other's reading, and an end whose reading ended closes itself (allowHalfOpen: false), so
// a ClientConnection sees 'close' as it would on a Unix socket.
import { Duplex } from 'node:stream';

export function duplexPair(): [Duplex, Duplex] {
  const ends: Duplex[] = [];
  const eofSent = [false, false];
  const sendEof = (to: number) => {
    if (eofSent[to]) return;
    eofSent[to] = true;
    ends[to]!.push(null);
  };
  for (const i of [0, 1]) {
    const other = 1 - i;
    ends.push(new Duplex({
      allowHalfOpen: false,
      read() {},
      write(chunk: Buffer, _encoding, done) {
        if (!eofSent[other]) ends[other]!.push(chunk);
        done();
      },
      final(done) {
        sendEof(other);
        done();
      },
      destroy(err, done) {
        sendEof(other);
        done(err);
      },
    }));
  }
  return [ends[0]!, ends[1]!];
}
