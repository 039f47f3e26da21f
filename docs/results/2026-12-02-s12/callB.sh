#!/usr/bin/env bash
# Session 12, GPU call B (one H200, torch 2.11): issue 24 - HF generate at 32 layers (default tessera against
# Inductor's default and cuda_graphs=True, then the warm first compile in a second fresh process); then the GPU tests
# that call A's time limit cut off (tests/backend from test_policies on, and tests/lowering/test_warm_path.py).
T0=$(date +%s); left() { echo $(( ${BUDGET:-565} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
F="^DEBUG\|attention mask\|lru_cache\|originates\|warn_once\|^$"
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 200 python3 -m pytest tests/backend/test_policies.py tests/backend/test_pytest_plugin.py \
  tests/backend/test_restart_records.py tests/backend/test_workload.py tests/lowering/test_warm_path.py -q \
  -p no:cacheprovider -o log_level=WARNING --durations=8 2>&1 | grep -v "^DEBUG" | tail -16
echo "== backend default 32 layers (+ warm compile) $(left) s left"
timeout $(( $(left) - 3 )) python3 bench/gpu_backend_default.py --out $OUT/bd --layers 32 --warm-layers 32 --repeats 6 \
  --budget-s $(( $(left) - 60 )) 2>&1 | grep -v "$F" | tail -12
echo "== end $(left) s left"
