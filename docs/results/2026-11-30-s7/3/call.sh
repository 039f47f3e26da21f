#!/bin/bash
# session 7 call 3: issue 5 - generation Must-show with configs pinned across devices and a deterministic attention backend;
# Inductor's own reproducibility; launch-level bits with the pinning
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
R=/tmp/res7c; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
G="bench/gpu_generate_check.py --layers 32 --graphs --graph-copies push --policy af --skip eager,tessera_af --repeat-reference"
run() { n=$1; shift; ( timeout 480 python3 "$@" > $R/$n.log 2>&1; echo "$n rc=$? $(date +%T)" >> $R/log.txt ) & }
echo "start $(date +%T)" >> $R/log.txt
run gen_det_eff bench/gpu_generate_check.py --out $R/gen_det_eff --layers 32 --graphs --graph-copies push --policy af --skip "eager,tessera af" --repeat-reference --deterministic --sdpa efficient
run gen_eff bench/gpu_generate_check.py --out $R/gen_eff --layers 32 --graphs --graph-copies push --policy af --skip "eager,tessera af" --repeat-reference --sdpa efficient
run gen_det_cudnn bench/gpu_generate_check.py --out $R/gen_det_cudnn --layers 32 --graphs --graph-copies push --policy af --skip "eager,tessera af" --repeat-reference --deterministic
run bw_eff bench/gpu_launch_bitwise.py --out $R/bw_eff --layers 4 --sdpa efficient --alt cuda:1,cuda:1@72sm,cuda:0@72sm,cuda:1@24sm
wait
cp scratch_gpu/c3.sh $R/call.sh
cd $R && tar czf $OUT/c3.tgz $(find . -type f -size -5M) ; ls -la $OUT
cat $R/log.txt; grep -h "MUST\|inductor again\|lowering vs" $R/*.log $R/*/child*.log | cut -c1-400
