#!/usr/bin/env bash
# Session 12, GPU call A (one H200, torch 2.11): issue 24 - HF generate at 8 layers, default tessera against
# Inductor's default and cuda_graphs=True, plus the warm first compile (second fresh process); then the GPU tests of
# tests/backend and the warm-path tests.
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader
F="^DEBUG\|attention mask\|lru_cache\|originates\|warn_once\|^$"
echo "== backend default 8 layers (+ warm compile) $(left) s left"
timeout 260 python3 bench/gpu_backend_default.py --out $OUT/bd --layers 8 --warm-layers 8 --repeats 6 --budget-s 250 2>&1 \
  | grep -v "$F" | tail -12
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 5 )) python3 -m pytest tests/backend tests/lowering/test_warm_path.py -q \
  -p no:cacheprovider -o log_level=WARNING 2>&1 | grep -v "^DEBUG" | tail -12
echo "== end $(left) s left"
