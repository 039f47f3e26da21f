#!/usr/bin/env bash
# Session 18, GPU call 3 (one H200): the GPU test suites after the cost-model change, and the refactored sweeps once.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
W=/tmp/call3; mkdir -p $W
TESSERA_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider tests/backend > $W/backend.log 2>&1
echo "backend rc=$?"; tail -3 $W/backend.log
TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/target tests/commands/test_calibrate_launch_times.py tests/commands/test_gpu_sweeps_dry_run.py tests/commands/test_pairs_calibrate.py > $W/target.log 2>&1
echo "target rc=$?"; tail -12 $W/target.log
timeout 60 python3 bench/gpu_convolution.py --out $W/conv --repeats 5 --sms 16 > $W/conv.log 2>&1; echo "conv rc=$?"; grep -c "us$" $W/conv.log
timeout 60 python3 bench/gpu_attention_mask.py --out $W/attn --repeats 5 --sms 16 > $W/attn.log 2>&1; echo "attn rc=$?"; tail -2 $W/attn.log
tar czf $OUT/call3.tgz -C $W .
