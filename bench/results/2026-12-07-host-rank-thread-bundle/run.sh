# 2026-12-07, the development VM (2 cores): BASE main 7c72c25 (/tmp/ref) against AFTER 0cbc72d (the
# warm rank thread runs dist/rank-thread.cjs), the 1.9 GB Llama at /tmp/h2g/model.
bash bench/restart-pair-host.sh bench/results/2026-12-07-host-rank-thread-bundle /tmp/ref 8 /tmp/h2g/model 1
