#!/bin/sh
# "before": the launcher as on main at the base commit, the bundle run directly with no code cache
# (same dist/main.cjs as "after", so the pairs differ only in the launcher and its cache).
root=$(cd "$(dirname "$(readlink -f "$0")")/../../.." && pwd)
exec node $(sed '/^#/d' "$root/scripts/node-flags") "$root/dist/main.cjs" "$@"
