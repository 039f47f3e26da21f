#!/usr/bin/env bash
# Session 11, GPU call 2 (one H200): issue 21 - MoE and Mamba launches timed back to back (whole GPU, 16/24/72-SM
# partitions); issue 23 - the explicit schedule captured as one CUDA graph for the MMDiT and Mamba (8 layers; Mamba at
# batch 8 x 16 tokens), the planner's plan beside the zero-cut plans, with the no-wait / alone split.
T0=$(date +%s); left() { echo $(( ${BUDGET:-430} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
echo "== cut diagnose dit,mamba $(left) s left"
timeout 230 python3 bench/gpu_cut_diagnose.py --out $OUT/cd --devices cuda:0@104sm,cuda:0@24sm \
  --model dit,mamba --layers 8 --plans tessera,homo-L,request-dist --modes captured,no-wait,alone --no-eager \
  --rounds 2 --calls 3 --budget-s 200 2>&1 | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|modeling_mamba\|is_\|^$\|falling back" | tail -30
echo "cd rc=$?"
cat $OUT/cd/cut_diagnose.md 2>/dev/null | head -30
echo "== kernel times moe,mamba $(left) s left"
timeout $(( $(left) - 5 )) python3 bench/gpu_kernel_times.py --out $OUT/kt --models moe,mamba --budget-s $(( $(left) - 15 )) \
  --model-s 30 2>&1 | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|modeling_mamba\|is_\|^$\|falling back" | tail -14
echo "kt rc=$?"
