#!/usr/bin/env bash
# Session 15, GPU call 4 (one H200): the merged callhost change (captured call's inputs checked in full once, then by
# a fingerprint): GPU tests of the runtime and the HF generate first, then issue 23's cut diagnosis (callhost's
# gpu_command.sh: Mamba, Llama, MMDiT at 8 layers on cuda:0@104sm,cuda:0@24sm) with the time left.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING -rs \
  tests/runtime tests/backend/test_hf_generate.py tests/backend/test_models_equal_eager.py \
  > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$?"; grep -v "^DEBUG" $OUT/gpu_tests.log | grep -v "^SKIPPED" | tail -5
echo "== cut diagnose $(left) s left"
BUDGET=$(( $(left) - 10 )) bash docs/results/2026-12-02-s15-callhost/gpu_command.sh
echo "== end $(left) s left"
