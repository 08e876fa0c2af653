// A restart across builds, with one keeper: this branch's daemon (keeps its plan in the record),
// then main's (a daemon before kept plans), then this branch's again, then main's keeper serving
// this branch's daemon. Each start's log lines about planning and adopting go to stdout.
// Run from the repository root: node bench/results/2026-12-05-host-restart-plan-record/across-builds/across-builds.mjs
import { mkdtempSync, appendFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnUntilReady } from '../../../../dist/bench/measure.js';
import { exampleModel } from '../../../../dist/test/helpers/paths.js';
import { KeeperClient } from '../../../../dist/src/keeper/keeperClient.js';

const builds = { after: `${process.cwd()}/weightd`, before: '/tmp/hplanrec-base/weightd' };
const socketDir = join(mkdtempSync(join(tmpdir(), 'across-')), 's');
const log = join(socketDir, '..', 'daemon.jsonl');
const env = { ...process.env, WEIGHTD_HOST_DEVICES: `across${process.pid}-0` };
async function start(which, keeper = 'spawn') {
  const d = await spawnUntilReady([builds[which], '--model', exampleModel, '--device', 'host', '--weight-cache-socket-dir', socketDir, '--keeper', keeper, '--log-level', 'debug'], env);
  const lines = d.lines().filter((l) => /checkpoint planned|planning model|adopted|refused|READY/.test(l.msg));
  console.log(`--- ${which} (--keeper ${keeper})`);
  for (const l of lines) console.log(JSON.stringify({ msg: l.msg.slice(0, 160), from: l.from, headersRead: l.headersRead, reason: l.reason, adoptedRanks: l.adoptedRanks }));
  await d.stop(log, { which });
}
await start('after');
await start('before');
await start('after');
// main's keeper, started by main's daemon, then this branch's daemon against it.
await new KeeperClient(join(socketDir, 'keeper.sock')).ping().then(async ({ pid }) => { process.kill(pid, 'SIGTERM'); await new Promise((r) => setTimeout(r, 500)); }).catch(() => {});
await start('before');
await start('after');
await start('after');
const { pid } = await new KeeperClient(join(socketDir, 'keeper.sock')).ping();
process.kill(pid, 'SIGTERM');
appendFileSync(log, '');
