#!/bin/bash
# session 6 call 1: serving sweep, full 32-layer Llama, default SLO; then runtime check if time is left
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - T0) )); }
mkdir -p /tmp/res
pip install -q --no-deps --no-build-isolation -e . > /tmp/res/pip.txt 2>&1
nvidia-smi --query-gpu=name,memory.used --format=csv > /tmp/res/smi.txt 2>&1
echo "== serve24 $(date +%T)" >> /tmp/res/log.txt
timeout $(( $(left) - 100 )) python3 -m torch_tessera.cli serve-bench --engine real --model llama --size full --layers 32 \
  --devices cuda:0,cuda:1@24sm --rates 4,6,9,13,18 --requests 48 --buckets 16,64 --out /tmp/res/serve24 >> /tmp/res/log.txt 2>&1
echo "rc=$? $(date +%T)" >> /tmp/res/log.txt
if [ $(left) -gt 110 ]; then
  echo "== rt $(date +%T)" >> /tmp/res/log.txt
  timeout $(( $(left) - 10 )) python3 bench/gpu_runtime_check.py --out /tmp/res/rt --layers 8 --devices cuda:0,cuda:1 --graph-copies link,push --no-segments --repeats 10 --no-compute-correction >> /tmp/res/log.txt 2>&1
  echo "rc=$? $(date +%T)" >> /tmp/res/log.txt
fi
cd /tmp/res && tar czf $OUT/s1.tgz . ; ls -la $OUT
