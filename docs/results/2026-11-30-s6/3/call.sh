#!/bin/bash
# session 6 call 3: priorities A/B on the measured bench (Llama, 24 SMs), then the generation Must-show
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - T0) )); }
R=/tmp/res6c; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
for mode in prio noprio; do
  extra=""; [ $mode = noprio ] && extra="--no-priorities"
  if [ $(left) -gt 150 ]; then
    echo "== l24 $mode $(date +%T)" >> $R/log.txt
    timeout $(( $(left) - 20 )) python3 -m torch_tessera.cli bench --measure --size full --layers 8 --model llama --devices cuda:0,cuda:1@24sm $extra --out $R/l24_$mode >> $R/log.txt 2>&1
    echo "rc=$? $(date +%T)" >> $R/log.txt
  fi
done
if [ $(left) -gt 60 ]; then
  echo "== gen $(date +%T)" >> $R/log.txt
  timeout $(( $(left) - 8 )) python3 bench/gpu_generate_check.py --out $R/gen --layers 32 --deterministic --graphs --graph-copies push --policy af --skip "eager,tessera af" >> $R/log.txt 2>&1
  echo "rc=$? $(date +%T)" >> $R/log.txt
fi
cd $R && tar czf $OUT/s3.tgz . ; ls -la $OUT
