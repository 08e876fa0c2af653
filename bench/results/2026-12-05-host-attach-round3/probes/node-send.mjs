// A Node server that writes 3.5 MB to each connection at once (one write), as the daemon writes a reply and its trailer.
import net from 'node:net';
import fs from 'node:fs';
const path = process.argv[2];
try { fs.unlinkSync(path); } catch {}
const payload = Buffer.alloc(3_498_311, 7);
net.createServer((s) => { s.once('data', () => { s.cork(); s.write(payload.subarray(0, 10)); s.write(payload); s.uncork(); }); s.on('error', () => {}); }).listen(path, () => console.log('listening'));
