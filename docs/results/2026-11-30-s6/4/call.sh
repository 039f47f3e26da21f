#!/bin/bash
# session 6 call 4: serving sweep with weights shared across executors (OOM fix), rates 4 and 9
export NCCL_NVLS_ENABLE=0
R=/tmp/res6d; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
echo "== serve24 $(date +%T)" >> $R/log.txt
timeout 372 python3 -m torch_tessera.cli serve-bench --engine real --model llama --size full --layers 32 \
  --devices cuda:0,cuda:1@24sm --rates 4,9 --requests 48 --buckets 16,64 --out $R/serve24 >> $R/log.txt 2>&1
echo "rc=$? $(date +%T)" >> $R/log.txt
nvidia-smi --query-gpu=memory.used --format=csv >> $R/log.txt 2>&1
cd $R && tar czf $OUT/s4.tgz $(find . -type f -size -5M); ls -la $OUT
