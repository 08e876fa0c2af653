// An experiment, not shipped: runs dist/main.cjs through vm.Script with a V8 code cache, made at
// the first run's exit (so it holds every function that run compiled) and read by the runs after;
// one cache per command (--version, ctl, the daemon), named by WEIGHTD_CODE_CACHE and the command.
// Measures what a compile cache would add to the bundle; Node 20 has none for ES modules.
const fs = require('node:fs');
const path = require('node:path');
const vm = require('node:vm');
const Module = require('node:module');
const file = path.resolve(__dirname, '../../../dist/main.cjs');
const command = process.argv[2] === '--version' ? 'version' : process.argv[2] === 'ctl' ? 'ctl' : 'daemon';
const cacheFile = `${process.env.WEIGHTD_CODE_CACHE}.${command}`;
let cachedData;
try {
  cachedData = fs.readFileSync(cacheFile);
} catch {}
const script = new vm.Script(Module.wrap(fs.readFileSync(file, 'utf8').replace(/^#!.*/, '')), { filename: file, cachedData });
if (!cachedData || script.cachedDataRejected) process.on('exit', () => fs.writeFileSync(cacheFile, script.createCachedData()));
const m = { exports: {} };
script.runInThisContext().call(m.exports, m.exports, Module.createRequire(file), m, file, path.dirname(file));
