set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*); export PATH=$B/bin:$PATH; ln -sfn $B/node_modules node_modules
mkdir -p dist build; ln -sfn $B/dist/src dist/src; cp $B/dist/main.js dist/main.js; ln -sfn $B/build/Release build/Release
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:clients/python
# Each test alone in its own process, so one test's CUDA error cannot poison the next.
for t in "test_zero_copy_from_the_daemon_generates_what_from_pretrained_does[llama]" test_a_daemon_serving_other_weights_is_not_used test_no_daemon_loads_from_disk test_a_home_grown_module_attaches_and_falls_back_to_the_safetensors test_a_meta_buffer_nothing_can_compute_is_refused_before_any_assignment; do
  WEIGHTD_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider "clients/python/tests/test_torch_load_into.py::$t" > $OUT/$t.log 2>&1; echo "$t rc=$?"; grep -E "^E  .*Error|passed|failed" $OUT/$t.log | head -3 | cut -c1-250
done
nvidia-smi --query-gpu=memory.used --format=csv
