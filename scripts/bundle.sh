#!/usr/bin/env bash
# `npm run bundle`: a self-contained tarball for GPU nodes that have no Node.js and no registry.
#   bash scripts/bundle.sh [OUTPUT.tar.gz]
#   bash scripts/bundle.sh --dir DIR      the same tree laid out in DIR (new or empty), no tarball
# Holds a Node.js binary, dist/, build/Release/weightd.node and weightd-keeper, package.json, the production
# node_modules, examples/, clients/, docs/ and deploy/, and bin/weightd, which runs dist/main.cjs with the
# bundled node, through dist/launch.cjs and the V8 code cache the build made (scripts/code-cache.mjs). Unpack anywhere and run weightd-<version>/bin/weightd (or link it into PATH); the
# units in deploy/systemd expect it unpacked as /opt/weightd (docs/operations.md, "Install").
# The addon opens libcuda at run time, so one bundle serves GPU and CPU-only nodes; it needs
# glibc at least as new as the build machine's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fail() { echo "bundle: $*" >&2; exit 1; }
[ -f build/Release/weightd.node ] || fail "build/Release/weightd.node is missing: run npm run build first"
[ -x build/Release/weightd-keeper ] || fail "build/Release/weightd-keeper is missing: run npm run build first"
[ -f dist/main.cjs ] || fail "dist/main.cjs is missing: run npm run build first"
[ -f dist/main.cjs.codecache ] || fail "dist/main.cjs.codecache is missing: run npm run build first"
[ -f dist/rank-thread.cjs ] || fail "dist/rank-thread.cjs is missing: run npm run build first"
[ -d node_modules ] || fail "node_modules is missing: run npm ci first"

version=$(node -p 'require("./package.json").version')
arch=$(node -p 'process.arch')
name="weightd-$version-linux-$arch"
if [ "${1:-}" = --dir ]; then
  [ -n "${2:-}" ] || fail "--dir needs a directory"
  dir=$(realpath -m "$2")
  [ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || fail "$dir is not empty"
  out=
else
  out=$(realpath -m "${1:-$root/$name.tar.gz}")
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  dir="$stage/$name"
fi
mkdir -p "$dir/bin" "$dir/build/Release" "$dir/dist"

# The daemon and its client library; compiled tests and benchmarks stay out.
cp -R dist/src dist/main.js dist/main.cjs dist/launch.cjs dist/main.cjs.codecache dist/rank-thread.cjs "$dir/dist/"
cp build/Release/weightd.node build/Release/weightd-keeper "$dir/build/Release/"
# The GPU digest kernel, where this build had nvcc (CMakeLists.txt); without it fills hash on the CPU.
if [ -f build/Release/weightd-digests.fatbin ]; then cp build/Release/weightd-digests.fatbin "$dir/build/Release/"; fi
cp package.json package-lock.json "$dir/"
for extra in examples clients docs deploy; do
  [ -d "$extra" ] && cp -R "$extra" "$dir/"
done
find "$dir/clients" -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null || true

# Runtime dependencies only, copied from the installed tree so no registry is needed. Of
# mermaid, the state-chart page serves one file: its 80 MB of sources stay out.
node scripts/prune-node-modules.mjs "$dir/node_modules"
mkdir -p "$dir/node_modules/mermaid/dist"
cp node_modules/mermaid/package.json "$dir/node_modules/mermaid/"
cp node_modules/mermaid/dist/mermaid.min.js "$dir/node_modules/mermaid/dist/"

# The same Node.js as this build: the packed Linux x64 binary where shared/device/pack-node.sh
# made one for this version, else the node running this script.
if [ -f .device/node.xz ] && [ "$(cat .device/node.version 2>/dev/null)" = "$(node -p 'process.versions.node')" ]; then
  xz -dc .device/node.xz > "$dir/bin/node"
else
  cp "$(node -p 'process.execPath')" "$dir/bin/node"
fi
chmod 755 "$dir/bin/node"

cat > "$dir/bin/weightd" <<'EOF'
#!/bin/sh
# Runs weightd with the Node.js bundled beside this script (symlinks to it are followed). No
# process is forked to find it or read the flags unless it is run through a link (the checkout's
# ./weightd says why).
case $0 in
  */*) if [ -L "$0" ]; then here=$(dirname "$(readlink -f "$0")"); else here=${0%/*}; fi ;;
  *) here=$(dirname "$(readlink -f "$0")") ;;
esac
# weightd makes no TLS connection: no Node start spent parsing extra CA certificates (./weightd says why).
unset NODE_EXTRA_CA_CERTS
# Node's flags: node-flags beside this script (the checkout's scripts/node-flags says why).
flags=
{ while IFS= read -r line || [ -n "$line" ]; do
  case $line in '#'* | '') ;; *) flags="$flags $line" ;; esac
done; } < "$here/node-flags" || exit 2
# shellcheck disable=SC2086 # one flag a word
exec "$here/node" $flags "$here/../dist/launch.cjs" "$@"
EOF
chmod 755 "$dir/bin/weightd"
cp scripts/node-flags "$dir/bin/node-flags"

if [ -z "$out" ]; then
  echo "$dir: run $dir/bin/weightd"
  exit 0
fi
tar -C "$stage" -czf "$out" "$name"
echo "$out ($(du -h "$out" | cut -f1)): unpack and run $name/bin/weightd"
