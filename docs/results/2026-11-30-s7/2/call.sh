#!/bin/bash
# session 7 call 2: issue 5 - launch-level bits on other devices (no deterministic mode); the generation Must-show without it; mamba bench
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - T0) )); }
R=/tmp/res7b; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
echo "== gen $(date +%T)" >> $R/log.txt
( timeout 400 python3 bench/gpu_generate_check.py --out $R/gen --layers 32 --graphs --graph-copies push --policy af --skip "eager,tessera af" > $R/gen.log 2>&1; echo "gen rc=$? $(date +%T)" >> $R/log.txt ) &
GEN=$!
echo "== bitwise nodet $(date +%T)" >> $R/log.txt
timeout 300 python3 bench/gpu_launch_bitwise.py --out $R/bw --layers 4 --alt cuda:1,cuda:1@72sm,cuda:0@72sm,cuda:1@24sm >> $R/log.txt 2>&1
echo "rc=$? $(date +%T)" >> $R/log.txt
wait $GEN
if [ $(left) -gt 200 ]; then
  echo "== mamba24 $(date +%T)" >> $R/log.txt
  timeout $(( $(left) - 12 )) python3 -m torch_tessera.cli bench --measure --size full --layers 8 --model mamba --devices cuda:0,cuda:1@24sm --prefill-tokens 16 --out $R/m24 >> $R/m24.log 2>&1
  echo "rc=$? $(date +%T)" >> $R/log.txt
fi
cp scratch_gpu/c2.sh $R/call.sh
cd $R && tar czf $OUT/c2.tgz $(find . -type f -size -5M) ; ls -la $OUT
