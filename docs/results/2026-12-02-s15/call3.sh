#!/usr/bin/env bash
# Session 15, GPU call 3 (one H200): issue 24's must-show at 8 layers (Inductor's default, tessera's default,
# cuda_graphs=True; warm-cache first compiles in a fresh process); issue 21's cuBLAS grid sweep (partfit); then
# tests/runtime on the GPU with the time left.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-585} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg
echo "== llama 8 layers, three cases, then warm compiles $(left) s left"
python3 bench/gpu_backend_default.py --out $OUT/bd --layers 8 --warm-layers 8 --repeats 4 --split \
  --budget-s 200 2>&1 | tail -6
echo "== cuBLAS grids $(left) s left"
timeout 100 python3 docs/results/2026-12-02-s14-partfit/cublas_grids.py --out $OUT > $OUT/cublas_grids.log 2>&1
echo "rc=$?"; tail -3 $OUT/cublas_grids.log
echo "== tests/runtime on the GPU $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 8 )) python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  -rs tests/runtime > $OUT/gpu_tests_runtime.log 2>&1; echo "pytest rc=$?"
grep -v "^DEBUG" $OUT/gpu_tests_runtime.log | grep -v "^SKIPPED" | tail -8
echo "== end $(left) s left"
