#!/usr/bin/env bash
# Session 18, GPU call 2 (one H200): issue 21 - the attention sweep again with ragged lengths and GPU-only timing
# (bench/gpu_attention_mask.py), the convolution sweep with GPU-only timing and per-device kernels
# (bench/gpu_convolution.py), and the registry's convolutions' kernels per device (probe2.py).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
W=/tmp/call2; mkdir -p $W
timeout 300 python3 bench/gpu_attention_mask.py --out $W/attn --repeats 21 2>&1 | tee $W/attn.log | grep -v "^DEBUG"
echo "attn rc=${PIPESTATUS[0]}"
timeout 200 python3 bench/gpu_convolution.py --out $W/conv 2>&1 | tee $W/conv.log | grep -v "^DEBUG" | grep -v kernels:
echo "conv rc=${PIPESTATUS[0]}"
timeout 100 python3 docs/results/2026-12-03-s18/probe2.py --out $W 2>&1 | tee $W/probe2.log | grep -v "^DEBUG"
echo "probe2 rc=${PIPESTATUS[0]}"
tar czf $OUT/call2.tgz -C $W .
