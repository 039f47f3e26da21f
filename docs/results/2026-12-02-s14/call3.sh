#!/usr/bin/env bash
# Session 14, GPU call 3 (one H200): issue 24 - the GPU tests of the runtime change that keeps one capture per program
# across generate calls (small STATE copied into the graph, outputs handed back in their dropped storage), then the
# 32-layer HF generate under Inductor and tessera's default after it, compiled in one process, round-robin rounds.
T0=$(date +%s); left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/backend/test_hf_generate.py tests/runtime/test_graph_calls.py tests/runtime/test_static_inputs.py \
  tests/backend/test_models_equal_eager.py 2>&1 | grep -v "^DEBUG" | tail -4
echo "== llama 32 layers $(left) s left"
mkdir -p $OUT/bd
timeout $(( $(left) - 5 )) python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 32 \
  --cases inductor,tessera --repeats 5 --split --result $OUT/bd/layers_32.json 2>&1 | grep "^\[layers"
echo "== end $(left) s left"
