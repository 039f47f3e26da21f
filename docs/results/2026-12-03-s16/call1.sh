#!/usr/bin/env bash
# Session 16, GPU call 1 (one H200, torch 2.11 / triton 3.6): the captured replay over one GPU returns at once
# (runtime/captured.py host_wait; inputcheck's weak references): its GPU tests, the runtime and HF generate tests,
# cuBLAS on partitions (issue 21 data), then issue 23's cut diagnosis (Mamba, Llama, MMDiT, 8 layers) with executed
# timed back to back and each call synchronized.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-570} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING -rs \
  tests/runtime tests/backend/test_hf_generate.py tests/backend/test_models_equal_eager.py \
  > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$?"; grep -v "^DEBUG" $OUT/gpu_tests.log | grep -v "^SKIPPED" | tail -8
echo "== cublas partitions $(left) s left"
timeout 120 python3 docs/results/2026-12-02-s15-partfit3/cublas_partitions.py --out $OUT/cublas > $OUT/cublas.log 2>&1
echo "cublas rc=$?"; tail -3 $OUT/cublas.log
echo "== cut diagnose $(left) s left"
BUDGET=$(( $(left) - 10 )) bash docs/results/2026-12-02-s15-callhost/gpu_command.sh
echo "== end $(left) s left"
