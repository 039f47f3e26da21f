#!/usr/bin/env bash
# Session 14, GPU call 2 (one H200): issue 24 - where an 8-layer HF generate's decode steps spend host time under
# Inductor and tessera (cProfile of one generate each, beside the step timed alone); then the backend GPU tests that
# session 13 could not run.
T0=$(date +%s); left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg; git log --oneline 2>/dev/null | head -1
echo "== llama 8 layers $(left) s left"
mkdir -p $OUT/bd
timeout 200 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 8 --cases inductor,tessera \
  --repeats 5 --split --step-loop 20 --cprofile-generate --result $OUT/bd/layers_8.json 2>&1 | grep "^\[layers"
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/backend/test_hf_generate.py tests/backend/test_hf_buckets.py tests/backend/test_readme_quickstart.py \
  tests/backend/test_restart_records.py tests/backend/test_pytest_plugin.py tests/backend/test_measured_costs.py \
  tests/backend/test_models_equal_eager.py 2>&1 | grep -v "^DEBUG" | tail -12
echo "== end $(left) s left"
