# 6 pairs, ref (main 62d77ad: dist, addon, client) and new (7e1b9cb's dist: the packed manifest
# encoded once per tensor list) alternating, on the fake libcuda (built from 7e1b9cb's
# test/gpu/fake-libcuda.c into /tmp/fk), each pulling 8 full updates of the model of make-model.py
# cut into 2 MiB segments (62), with this bench script in both trees.
for i in 1 2 3 4 5 6; do for w in ref new; do d=/work/main; [ $w = ref ] && d=/tmp/ref62
  (cd $d && LD_LIBRARY_PATH=/tmp/fk FAKE_CUDA_DEVICES=2 PYTHONPATH=clients/python:clients/python/tests /work/main/.venv/bin/python bench/pull-split-fake.py 8 $R/$w-$i.log --model /tmp/l20 --segment-bytes 2097152 > $R/$w-$i.json 2>&1)
  echo "$w $i $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/load.txt
done; done
