#!/usr/bin/env bash
# Session 10, GPU call 3 (one H200): issue 23 - the explicit schedule captured as one CUDA graph (cut diagnosis, three models).
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site
set -o pipefail
TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest tests/runtime/test_captured_replay.py -q -x -p no:cacheprovider \
  -o log_level=WARNING 2>&1 | grep -v "^DEBUG" | tail -4
timeout 420 python3 bench/gpu_cut_diagnose.py --out $OUT/onegraph --devices cuda:0@104sm,cuda:0@24sm --layers 8 \
  --rounds 3 --calls 5 --budget-s 300 2>&1 | grep -v "^DEBUG" | tail -60
