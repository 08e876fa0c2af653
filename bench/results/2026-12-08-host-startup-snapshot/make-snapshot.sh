#!/bin/bash
# An experiment, not the product: dist/main.cjs (built at 1671728) turned into a Node.js user-land
# startup snapshot (node --build-snapshot, Node 20.20.2), to measure what deserializing the bundle's
# initialised modules would take off a start. Writes $1/entry.cjs and $1/snap.blob.
# The entry: the bundle with `module`/`__dirname` defined (the snapshot builder has neither), the
# one package it requires at load (@node-rs/xxhash, before 1671728 made it lazy) deferred, the
# command line's and the node's modules initialised at build time, and main() run from
# v8.startupSnapshot's deserialize function with process.argv.slice(1) (no script path there).
# Built with the daemon's own V8 flag (scripts/node-flags), which the blob must match.
set -euo pipefail
out=$1; mkdir -p "$out"
python3 - "$out/entry.cjs" <<'PY'
import sys
s = open('dist/main.cjs').read()
a = 'main(process.argv.slice(2)).then((code) => endProcess(code, stopSignal, true), (err) => {\n  writeCliError(`internal error: ${err?.stack ?? String(err)}`, { code: "E_INTERNAL" });\n  endProcess(1, stopSignal, true);\n});'
assert a in s
s = s.replace(a, 'init_parseArgs(); init_startNode();\nrequire("v8").startupSnapshot.setDeserializeMainFunction(() => {\n' + a.replace('slice(2)', 'slice(1)') + '\n});')
first, rest = s.split('\n', 1)
import os
dist = os.path.abspath('dist')
s = f'var module = {{ exports: {{}} }}, exports = module.exports; var __dirname = "{dist}", __filename = "{dist}/main.cjs";\n' + rest
open(sys.argv[1], 'w').write(s)
PY
node --max-semi-space-size=1 --snapshot-blob "$out/snap.blob" --build-snapshot "$out/entry.cjs" 2> "$out/build.err"
ls -la "$out/snap.blob"
