#!/usr/bin/env bash
# Session 15, GPU call 1 (one H200): issue 24 - does session 14's fix 2 (a whole graph drops its pools' references to
# the caller's STATE) stop the capture per HF generate on the GPU? The probe's log of moved inputs, the new GPU test
# (three generates, one capture per program), the 8-layer generate under Inductor and tessera's default (with a
# cProfile of one generate each), then tests/backend on the GPU with the time left.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-585} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
echo "== moved probe $(left) s left"
timeout 90 python3 docs/results/2026-12-02-s14/moved_probe.py > $OUT/moved_probe.log 2>&1; echo "rc=$?"
grep -i "moved\|captur\|generate\|Error" $OUT/moved_probe.log | head -12
echo "== GPU test of three generates $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  tests/backend/test_hf_generate.py > $OUT/gpu_test_hf_generate.log 2>&1; echo "rc=$?"
grep -v "^DEBUG" $OUT/gpu_test_hf_generate.log | tail -4
echo "== llama 8 layers $(left) s left"
mkdir -p $OUT/bd
timeout 200 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 8 --cases inductor,tessera \
  --repeats 4 --split --cprofile-generate --result $OUT/bd/layers_8.json 2>&1 | grep "^\[layers"
python3 -c "
import json; d=json.load(open('$OUT/bd/layers_8.json'))
for c in ('inductor', 'tessera'):
    t=d['cases'][c].get('cprofile_generate', '')
    print(c, [l.strip()[:150] for l in t.splitlines() if 'capture' in l.lower() or 'instantiate' in l][:5])" 2>&1 | tail -3
echo "== tests/backend on the GPU $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 8 )) python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING \
  -rs tests/backend > $OUT/gpu_tests_backend.log 2>&1; echo "pytest rc=$?"
grep -v "^DEBUG" $OUT/gpu_tests_backend.log | grep -v "^SKIPPED" | tail -15
echo "== end $(left) s left"
