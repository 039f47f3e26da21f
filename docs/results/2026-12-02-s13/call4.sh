#!/usr/bin/env bash
# Session 13, GPU call 4 (one H200), on main after the four helpers' merges: the GPU tests of what changed (runtime
# replay of the plan's schedule, captured replay, the backend's option checks and policies); Llama's cut diagnosis
# with its costs and schedules saved (re-simulated offline); Mamba's bf16 error against fp32 per way of running it.
T0=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg; git log --oneline 2>/dev/null | head -1
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 250 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/runtime/test_captured_replay.py tests/runtime/test_replay.py tests/backend/test_bad_options.py \
  tests/backend/test_policies.py 2>&1 | grep -v "^DEBUG" | tail -8
echo "== cut diagnose llama $(left) s left"
timeout $(( $(left) - 70 )) python3 bench/gpu_cut_diagnose.py --out $OUT/cd --devices cuda:0@104sm,cuda:0@24sm \
  --model llama --layers 8 --plans tessera,af,homo-L --modes captured,no-wait,alone --no-eager \
  --rounds 2 --calls 3 --budget-s $(( $(left) - 90 )) 2>&1 | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|is_\|^$\|falling back" | tail -5
grep "^|" $OUT/cd/cut_diagnose.md 2>/dev/null
echo "== numerics mamba $(left) s left"
timeout $(( $(left) - 5 )) python3 bench/gpu_numerics_check.py --out $OUT/nc --model mamba,llama --layers 8 \
  --shape mamba=8x16 2>&1 | grep "^mamba\|^llama"
echo "== end $(left) s left"
