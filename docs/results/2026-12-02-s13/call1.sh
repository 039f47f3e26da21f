#!/usr/bin/env bash
# Session 13, GPU call 1 (one H200): issue 24 - where the 32-layer default loses to Inductor (generate split into
# prefill and decode, and one generate of each under torch.profiler); issue 23 - the MMDiT's planner plan with the
# co-run model beside the zero-cut plans (captured, no-wait, alone).
T0=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "== 32 layers: inductor, tessera (split, profile) $(left) s left"
mkdir -p $OUT/bd
timeout 300 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 32 --cases inductor,tessera \
  --repeats 6 --split --profile --result $OUT/bd/layers_32.json 2>&1 | grep "^\[layers" ; echo "bd rc=$?"
echo "== cut diagnose dit $(left) s left"
timeout $(( $(left) - 10 )) python3 bench/gpu_cut_diagnose.py --out $OUT/cd --devices cuda:0@104sm,cuda:0@24sm \
  --model dit --layers 8 --plans tessera,homo-L,request-dist --modes captured,no-wait,alone --no-eager \
  --rounds 2 --calls 3 --budget-s $(( $(left) - 30 )) 2>&1 | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|is_\|^$\|falling back" | tail -12
echo "cd rc=$?"
cat $OUT/cd/cut_diagnose.md 2>/dev/null | head -30
