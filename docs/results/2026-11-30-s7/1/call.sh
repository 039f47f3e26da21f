#!/bin/bash
# session 7 call 1: issue 5 - which launches compute different bits on another GPU / an SM partition; lowering vs Inductor
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - T0) )); }
R=/tmp/res7a; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/smi.txt 2>&1
echo "== bitwise det $(date +%T)" >> $R/log.txt
timeout $(( $(left) - 200 )) python3 bench/gpu_launch_bitwise.py --out $R/bw_det --layers 4 --deterministic --alt cuda:1,cuda:1@72sm,cuda:0@72sm,cuda:1@24sm >> $R/log.txt 2>&1
echo "rc=$? $(date +%T)" >> $R/log.txt
if [ $(left) -gt 150 ]; then
  echo "== bitwise nodet $(date +%T)" >> $R/log.txt
  timeout $(( $(left) - 15 )) python3 bench/gpu_launch_bitwise.py --out $R/bw_nodet --layers 2 --alt cuda:1,cuda:1@72sm >> $R/log.txt 2>&1
  echo "rc=$? $(date +%T)" >> $R/log.txt
fi
cp scratch_gpu/c1.sh $R/call.sh
cd $R && tar czf $OUT/c1.tgz $(find . -type f -size -5M) ; ls -la $OUT
