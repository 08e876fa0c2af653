#!/bin/bash
# Each rank of tp 1, 2 and 4 once, hot page cache, on the 1.9 GB Llama of /tmp/h2g/model; rows to raw.jsonl.
set -e
here=$(cd "$(dirname "$0")" && pwd)
model=${MODEL:-/tmp/h2g/model}
cat $model/*.safetensors > /dev/null
for tp in 1 2 4; do
  for rank in $(seq 0 $((tp - 1))); do node "$here/reread.mjs" /work/main "$model" $tp $rank; done
done >> "$here/raw.jsonl"
