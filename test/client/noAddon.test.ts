// The client loads the addon on first use, not on import (src/native/addon.ts says why): from a
// copy of the package without build/ (the addon never built), importing weightd/client works, and
// the first call that needs native code (checking who serves a socket) fails with E_ADDON_LOAD.
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';

const pkg = mkdtempSync(join(tmpdir(), 'weightd-client-noaddon-'));
cpSync(join(repoRoot, 'dist'), join(pkg, 'dist'), { recursive: true });
cpSync(join(repoRoot, 'package.json'), join(pkg, 'package.json'));
symlinkSync(join(repoRoot, 'node_modules'), join(pkg, 'node_modules'));

test('importing the client loads no addon; connecting, which checks the peer, says the addon is missing', () => {
  const script = join(pkg, 'client.mjs');
  writeFileSync(
    script,
    `import { createServer } from 'node:net';
const client = await import(${JSON.stringify(join(pkg, 'dist', 'src', 'client', 'index.js'))});
const out = { imported: typeof client.WeightdClient.connect };
const socket = ${JSON.stringify(join(pkg, 'client.sock'))};
const server = createServer().listen(socket);
await new Promise((r) => server.once('listening', r));
try {
  await client.WeightdClient.connect(socket);
  out.connected = 'connected';
} catch (err) {
  out.connected = err.name + ' ' + err.code;
}
server.close();
console.log(JSON.stringify(out));
`,
  );
  const r = spawnSync(process.execPath, [script], { encoding: 'utf8', timeout: 20_000 });
  assert.is(r.status, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout), { imported: 'function', connected: 'DeviceError E_ADDON_LOAD' });
});

test.after(() => rmSync(pkg, { recursive: true, force: true }));
test.run();
