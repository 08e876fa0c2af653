# 2026-12-07, the development VM (2 cores): BASE main e36603e (/tmp/ref) against AFTER 92fc6ac (warm
# rank threads started when the keeper's first PING fails), the 1.9 GB Llama at /tmp/h2g/model.
bash bench/restart-pair-host.sh bench/results/2026-12-07-host-warm-threads-at-spawn /tmp/ref 8 /tmp/h2g/model 1
