// A bare Node server that answers any request as the daemon answers a packed get_state at 50,439
// tensors: one corked write of the reply frame (10-byte header, 82 + 413 bytes of JSON) and the
// packed frame (10-byte header, 3,498,311 bytes), from buffers made once, as EncodedManifest's.
import net from 'node:net';
import fs from 'node:fs';
const path = process.argv[2];
try { fs.unlinkSync(path); } catch {}
const head = (n) => { const b = Buffer.alloc(10); b.write('WGTD', 0, 'latin1'); b.writeUInt16BE(1, 4); b.writeUInt32BE(n, 6); return b; };
const a = Buffer.from(`{"id":1,"ok":true,${' '.repeat(82 - 19)}`), b = Buffer.from(`"x":"${'y'.repeat(413 - 7)}"}`);
const packed = Buffer.alloc(3_498_311, 7);
net.createServer((s) => {
  s.on('data', () => { s.cork(); for (const x of [head(a.length + b.length), a, b, head(packed.length), packed]) s.write(x); s.uncork(); });
  s.on('error', () => {});
}).listen(path, () => console.log('listening'));
