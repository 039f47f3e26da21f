#!/usr/bin/env bash
# Session 14, GPU call 3 (one H200): issue 24 - the GPU tests of the runtime change that keeps one capture per program
# across generate calls (small STATE copied into the graph, outputs handed back in their dropped storage), then the
# 32-layer HF generate under Inductor and tessera's default after it (one process, round-robin rounds); issue 23 -
# mambasim's cut diagnosis (executed against simulated, device- and host-side timing of the captured call) for Mamba,
# Llama and the MMDiT at 8 layers on 104 + 24 SMs, with the time left.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-585} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/backend/test_hf_generate.py tests/runtime/test_graph_calls.py tests/runtime/test_static_inputs.py \
  2>&1 | grep -v "^DEBUG" | tail -4
echo "== llama 32 layers $(left) s left"
mkdir -p $OUT/bd
timeout 240 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 32 \
  --cases inductor,tessera --repeats 4 --split --result $OUT/bd/layers_32.json 2>&1 | grep "^\[layers"
echo "== cut diagnose $(left) s left"
BUDGET=$(( $(left) - 5 )) bash docs/results/2026-12-02-s14-mambasim/gpu_command.sh
echo "== end $(left) s left"
