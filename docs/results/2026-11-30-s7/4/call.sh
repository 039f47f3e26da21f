#!/bin/bash
# session 7 call 4: issue 5 - the generation Must-show with configs pinned across devices, efficient attention, no
# deterministic mode (call 3: the only setting in which Inductor reproduced itself); then launch-level bits (one at a time: call 3 ran out of memory with four processes)
export NCCL_NVLS_ENABLE=0
R=/tmp/res7d; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
echo "start $(date +%T)" >> $R/log.txt
timeout 330 python3 bench/gpu_generate_check.py --out $R/gen_eff --layers 32 --graphs --graph-copies push --policy af --skip "eager,tessera af" --repeat-reference --sdpa efficient > $R/gen_eff.log 2>&1
echo "gen_eff rc=$? $(date +%T)" >> $R/log.txt
timeout 200 python3 bench/gpu_launch_bitwise.py --out $R/bw_eff --layers 4 --sdpa efficient --alt cuda:1,cuda:1@72sm,cuda:0@72sm,cuda:1@24sm > $R/bw_eff.log 2>&1
echo "bw_eff rc=$? $(date +%T)" >> $R/log.txt
cp scratch_gpu/c4.sh $R/call.sh
cd $R && tar czf $OUT/c4.tgz $(find . -type f -size -5M) ; ls -la $OUT
cat $R/log.txt; grep -h "MUST\|inductor again\|lowering vs\|launches differ" $R/*.log | cut -c1-300
