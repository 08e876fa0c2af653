#!/bin/sh
unset NODE_EXTRA_CA_CERTS
exec node --max-semi-space-size=1 /tmp/snapx/dist/launch.cjs "$@"
