# 2026-12-07, the development VM: a prototype, not shipped. Makes a V8 startup snapshot of main
# e36603e's bundle (node --build-snapshot, Node 20.20.2) with the modules of a daemon's start
# initialised: dist/snap-entry.cjs from dist/main.cjs, in a copy of dist/ at /tmp/snapx (paths
# are frozen at build time). Its main() runs from the snapshot's deserialize function. Packages
# the snapshot cannot hold (@node-rs/xxhash, piscina: native, or files beside them) are
# required on first use. Then:
#   node --max-semi-space-size=1 --snapshot-blob dist/snap.blob --build-snapshot dist/snap-entry.cjs
# and bench/restart.ts with WEIGHTD_BIN=wmix.sh (a start that loads through dist/launch.cjs, the
# restart through the snapshot) against wlaunch.sh (both through dist/launch.cjs), 2 x 3 runs.
# Found: a start that loads through the snapshot fails once pino's log write meets EAGAIN
# (atomic-sleep's module-level SharedArrayBuffer is undefined after deserialization).
import re
src = open('dist/main.cjs').read().replace('#!/usr/bin/env node\n', '', 1)
tail = 'main(process.argv.slice(2)).then((code) => endProcess(code, stopSignal, true), (err) => {'
i = src.index(tail)
j = src.index('});\n// Annotate', i) + 3
run = src[i:j]
pre = 'init_version(); init_parseArgs(); init_cuda(); init_supervisor(); init_startNode();\n'
src = src[:i] + pre + "require('node:v8').startupSnapshot.setDeserializeMainFunction(() => { globalThis.__rtRequire = require('node:module').createRequire('/tmp/snapx/dist/main.cjs'); " + run + " });\n" + src[j:]
src = re.sub(r'require\("(@node-rs/xxhash|piscina)"\)', r'__lazyReq("\1")', src)
helper = 'function __lazyReq(name){ let m; const get=()=> m ??= globalThis.__rtRequire(name); return new Proxy({}, {get:(t,k)=>get()[k], has:(t,k)=> k in get()}); }\n'
src = "(function(exports, module, __filename, __dirname){\n" + helper + src + "\n})({}, {exports:{}}, '/tmp/snapx/dist/main.cjs', '/tmp/snapx/dist');\n"
open('dist/snap-entry.cjs', 'w').write(src)
