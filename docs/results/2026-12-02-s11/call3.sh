#!/usr/bin/env bash
# Session 11, GPU call 3 (one H200, the session's last device time): issue 24 - the warm first compile with the
# compile cache, default against Inductor and cuda_graphs=True (8 layers); the GPU tests of tests/backend; issue 23 -
# the MMDiT on the 104 + 24 partitions planned with the co-run model, beside homo-L.
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
F="^DEBUG\|attention mask\|lru_cache\|originates\|warn_once\|^$"
echo "== backend default (warm compile) $(left) s left"
timeout 215 python3 bench/gpu_backend_default.py --out $OUT/bd --layers 8 --warm-layers 8 --repeats 6 --budget-s 205 2>&1 \
  | grep -v "$F" | tail -8
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 110 )) python3 -m pytest tests/backend -q -x -p no:cacheprovider \
  -o log_level=WARNING 2>&1 | grep -v "^DEBUG" | tail -6
echo "== cut diagnose dit $(left) s left"
timeout $(( $(left) - 3 )) python3 bench/gpu_cut_diagnose.py --out $OUT/cd --devices cuda:0@104sm,cuda:0@24sm \
  --model dit --layers 8 --plans tessera,homo-L --modes captured,alone --no-eager --rounds 2 --calls 3 \
  --budget-s $(( $(left) - 20 )) 2>&1 | grep -v "$F" | tail -4
cat $OUT/cd/cut_diagnose.md 2>/dev/null | tail -6
