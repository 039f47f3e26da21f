#!/usr/bin/env bash
# Session 19, GPU call 1 (one H200, torch 2.11): the fixed-layout VLM lowers and plans under the GPU machine's torch,
# the new tests pass there, and the backend's GPU tests after the workload change.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
W=/tmp/call1; mkdir -p $W
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/models/test_fixed_layout.py > $W/fixed_layout.log 2>&1
echo "fixed_layout rc=$?"; tail -3 $W/fixed_layout.log
( time timeout 240 python3 -m torch_tessera.cli pairs --models qwen2-vl --pairs a100+l40s --out $W/pairs ) > $W/pairs.log 2>&1
echo "pairs rc=$?"; tail -16 $W/pairs.log
TESSERA_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/backend > $W/backend.log 2>&1
echo "backend rc=$?"; tail -3 $W/backend.log
tar czf $OUT/call1.tgz -C $W .
