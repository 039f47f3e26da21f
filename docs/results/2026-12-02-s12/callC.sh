#!/usr/bin/env bash
# Session 12, GPU call C (one H200, torch 2.11): issue 24 - HF generate at 8 and 32 layers, the three cases compiled
# in one process and then timed in round-robin rounds (bench/gpu_backend_default.py after call B showed order
# effects of up to 30 % between sequentially timed cases); then tests/backend/test_workload.py on the GPU with its
# summary line (calls A and B ran all of tests/backend, but call B's summary was cut off).
T0=$(date +%s); left() { echo $(( ${BUDGET:-470} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
F="^DEBUG\|attention mask\|lru_cache\|originates\|warn_once\|^$"
echo "== backend default 8 and 32 layers, round-robin timing $(left) s left"
timeout $(( $(left) - 75 )) python3 bench/gpu_backend_default.py --out $OUT/bd --layers 8,32 --warm-layers "" --repeats 10 \
  --budget-s $(( $(left) - 80 )) 2>&1 | grep -v "$F" | tail -8
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 3 )) python3 -m pytest tests/backend/test_workload.py -q -p no:cacheprovider \
  -o log_level=WARNING 2>&1 | grep -v "^DEBUG" | tail -4
echo "== end $(left) s left"
