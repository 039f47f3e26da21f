#!/usr/bin/env bash
# Session 15, GPU call 2 (one H200): issue 24's must-show at 32 layers with session 14's fix 2 (one capture per
# program across generates): the HF generate under Inductor's default, tessera's default and tessera with
# cuda_graphs=True (one process, round-robin rounds), then the warm-cache first compile of Inductor and tessera in a
# fresh process.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-585} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg
echo "== llama 32 layers, three cases, then warm compiles $(left) s left"
python3 bench/gpu_backend_default.py --out $OUT/bd --layers 32 --warm-layers 32 --repeats 4 --split \
  --budget-s $(( $(left) - 15 )) 2>&1 | tail -8
echo "== end $(left) s left"
