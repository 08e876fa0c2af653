#!/bin/sh
unset NODE_EXTRA_CA_CERTS
n=$(cat /tmp/wmix.n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /tmp/wmix.n
case "$*" in *--model*) ;; *) exec node --max-semi-space-size=1 /tmp/snapx/dist/launch.cjs "$@";; esac
if [ $((n % 2)) = 1 ]; then exec node --max-semi-space-size=1 /tmp/snapx/dist/launch.cjs "$@"; fi
exec node --max-semi-space-size=1 --snapshot-blob /tmp/snapx/dist/snap.blob weightd "$@"
