#!/usr/bin/env bash
# Session 11, GPU call 1 (one H200): issue 21 - every launch of the registry models timed back to back on the whole
# GPU and 16/24/72-SM partitions (for `tessera calibrate --data launch-times`); issue 23 - the explicit schedule
# captured as one CUDA graph for Mamba and the MMDiT (8 layers), with the zero-cut plans and the no-wait / alone split.
T0=$(date +%s); left() { echo $(( ${BUDGET:-580} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
echo "== kernel times $(left) s left"
timeout 290 python3 bench/gpu_kernel_times.py --out $OUT/kt --budget-s 270 --model-s 45 2>&1 | grep -v "^DEBUG" | tail -25
echo "kt rc=$?"
echo "== cut diagnose mamba,dit $(left) s left"
timeout $(( $(left) - 8 )) python3 bench/gpu_cut_diagnose.py --out $OUT/cd --devices cuda:0@104sm,cuda:0@24sm \
  --model mamba,dit --layers 8 --plans tessera,homo-L,homo-R,request-dist --modes captured,no-wait,alone --no-eager \
  --rounds 2 --calls 3 --budget-s $(( $(left) - 30 )) 2>&1 | grep -v "^DEBUG" | tail -40
echo "cd rc=$?"
cat $OUT/cd/cut_diagnose.md 2>/dev/null | head -40
