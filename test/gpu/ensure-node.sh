# Sourced by the GPU scripts: GPU hosts have no Node.js, so use the one that
# shared/device/pack-node.sh packed into .device/node.xz when `node` is missing.
if ! command -v node >/dev/null; then
  if [ ! -f .device/node.xz ]; then
    echo "no node on PATH and no .device/node.xz: run shared/device/pack-node.sh where npm works" >&2
    exit 1
  fi
  mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node
  export PATH=/tmp/nodebin:$PATH
fi
