#!/usr/bin/env bash
# Session 14, GPU call 3 (one H200): issue 24 - the 8-layer HF generate after the fix that keeps one capture per
# program across generate calls (small STATE copied into the graph, outputs handed back in their dropped storage),
# with the GPU tests of that runtime change; issue 23 - mambasim's cut diagnosis (executed against simulated, device-
# and host-side timing of the captured call) for Mamba, Llama and the MMDiT at 8 layers on 104 + 24 SMs.
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg
echo "== llama 8 layers $(left) s left"
mkdir -p $OUT/bd
timeout 150 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 8 --cases inductor,tessera \
  --repeats 5 --split --step-loop 20 --result $OUT/bd/layers_8.json 2>&1 | grep "^\[layers"
python3 -c "
import json; d=json.load(open('$OUT/bd/layers_8.json'))
print('explain:', d['cases']['tessera'].get('explain', '')[:600])" 2>&1 | tail -8
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/backend/test_hf_generate.py tests/runtime/test_graph_calls.py tests/runtime/test_static_inputs.py \
  2>&1 | grep -v "^DEBUG" | tail -4
echo "== cut diagnose $(left) s left"
BUDGET=$(( $(left) - 5 )) bash docs/results/2026-12-02-s14-mambasim/gpu_command.sh
echo "== end $(left) s left"
