#!/usr/bin/env bash
# Session 18, GPU call 1 (one H200): issue 21 - cuDNN convolutions (patchify 2-D and depthwise 1-D, non-registry
# shapes) timed on the whole GPU and 16/24/72-SM partitions with their kernels (bench/gpu_convolution.py), and a probe
# of the registry's own convolutions and of ragged attention lengths (probe.py).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
W=/tmp/call1; mkdir -p $W
timeout 300 python3 bench/gpu_convolution.py --out $W/conv 2>&1 | tee $W/conv.log | grep -v "^DEBUG"
echo "conv rc=${PIPESTATUS[0]}"
timeout 200 python3 docs/results/2026-12-03-s18/probe.py --out $W 2>&1 | tee $W/probe.log | grep -v "^DEBUG"
echo "probe rc=${PIPESTATUS[0]}"
tar czf $OUT/call1.tgz -C $W .
