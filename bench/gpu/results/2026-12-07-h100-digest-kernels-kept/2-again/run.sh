# Run on the same warm machine right after 1-call (inline command of the device call): update_cuda.py
# again, ref (main 62d77ad, /tmp/refroot from 1-call) first, then this tree. NOT A VALID PAIR: the
# call's carry replaced build/Release, so this tree's addon had no GPU digest kernel beside it
# (1-call built it there); its pulls copied with the driver and hashed on the CPU (digestMs ~335,
# gpuDigestUnavailable in its daemon log). The ref's tree kept the kernel 1-call copied into it.
export PATH=/tmp/nodebin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1; W=/tmp/w2; mkdir -p $W; U="--layers 20 --hidden 4096 --pull-reps 3"
for which in ref:/tmp/refroot new:$PWD; do name=u-${which%%:*}; root=${which#*:}
  (cd $root && PYTHONPATH=$root/clients/python:/tmp/site timeout 150 python3 test/gpu/update_cuda.py --out-dir $W/$name $U > $W/$name.log 2>&1; echo "rc $?" >> $W/$name.log)
  rm -rf /var/tmp/weightd-update-cuda-*; mkdir -p $OUT/$name; cp $W/$name.log $OUT/; cp $W/$name/* $OUT/$name/
done
