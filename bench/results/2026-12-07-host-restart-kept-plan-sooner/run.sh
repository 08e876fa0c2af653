# 2026-12-07, the development VM (2 cores): BASE main 92fc6ac (/tmp/ref) against AFTER 7c72c25 (the
# record parsed without zod's compiled fast path, the planner digest from the bundle, the keeper's
# LIST while the devices are probed), the example checkpoint, 3 runs each.
bash bench/restart-pair-host.sh bench/results/2026-12-07-host-restart-kept-plan-sooner /tmp/ref 8 /work/main/examples/tiny-llama 3
