#!/usr/bin/env bash
# Session 13, GPU call 2 (one H200): issue 24 - one recorded 32-layer decode step called alone (synced, host-only,
# back to back, cProfile) under Inductor and tessera; issue 23 - Llama and Mamba (8 layers) with the co-run planner
# beside af and the zero-cut plans (captured, no-wait, alone).
T0=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
echo "== 32 layers: inductor, tessera (split, step loop) $(left) s left"
mkdir -p $OUT/bd
timeout 290 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 32 --cases inductor,tessera \
  --repeats 4 --split --step-loop 40 --result $OUT/bd/layers_32.json 2>&1 | grep "^\[layers" ; echo "bd rc=$?"
echo "== cut diagnose llama,mamba $(left) s left"
timeout $(( $(left) - 10 )) python3 bench/gpu_cut_diagnose.py --out $OUT/cd --devices cuda:0@104sm,cuda:0@24sm \
  --model llama,mamba --layers 8 --plans tessera,af,homo-L,request-dist --modes captured,no-wait,alone --no-eager \
  --rounds 2 --calls 3 --budget-s $(( $(left) - 30 )) 2>&1 | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|modeling_mamba\|is_\|^$\|falling back" | tail -8
echo "cd rc=$?"
cat $OUT/cd/cut_diagnose.md 2>/dev/null | grep "^|\|^#"
