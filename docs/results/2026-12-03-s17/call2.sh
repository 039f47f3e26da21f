#!/usr/bin/env bash
# Session 17, GPU call 2 (one H200): the GPU test suites after the kernel cost model's change (mask term, fits from
# several starts, cuBLAS's transposed-weight grid, CALIBRATED refitted): tests/backend and tests/target with
# TESSERA_TEST_DEVICE=cuda, and the calibrate/census/pairs tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
W=/tmp/call2; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
TESSERA_TEST_DEVICE=cuda timeout 420 python3 -m pytest -q -p no:cacheprovider tests/backend > $W/gpu_tests_backend.log 2>&1
echo "backend rc=$?"; tail -3 $W/gpu_tests_backend.log
TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/target \
  tests/commands/test_calibrate_launch_times.py > $W/gpu_tests_target.log 2>&1
echo "target rc=$?"; tail -3 $W/gpu_tests_target.log
tar czf $OUT/call2.tgz -C $W .
