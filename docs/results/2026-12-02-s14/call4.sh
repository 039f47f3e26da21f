#!/usr/bin/env bash
# Session 14, GPU call 4 (one H200): issue 24 - the GPU tests of the runtime change (one capture per program across
# generate calls), saved; then one 8-layer generate under tessera's default in cProfile, to see whether a generate
# still captures a graph.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-230} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/backend/test_hf_generate.py tests/runtime/test_graph_calls.py tests/runtime/test_static_inputs.py \
  > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$?"; grep -v "^DEBUG" $OUT/gpu_tests.log | tail -4
echo "== llama 8 layers $(left) s left"
mkdir -p $OUT/bd
timeout $(( $(left) - 5 )) python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 8 --cases tessera \
  --repeats 3 --split --cprofile-generate --result $OUT/bd/layers_8.json 2>&1 | grep "^\[layers"
python3 -c "
import json; d=json.load(open('$OUT/bd/layers_8.json')); t=d['cases']['tessera']['cprofile_generate']
print([l for l in t.splitlines() if 'capture' in l or 'utils.py:380' in l or 'hand_out' in l][:8])" 2>&1 | tail -3
echo "== end $(left) s left"
