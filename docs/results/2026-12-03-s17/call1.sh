#!/usr/bin/env bash
# Session 17, GPU call 1 (one H200): issue 21 - what an additive mask costs cuDNN's fused attention per score, on the
# whole GPU and 16/24/72-SM partitions (bench/gpu_attention_mask.py), for the kernel cost model's mask_ops.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
W=/tmp/call1; mkdir -p $W
timeout 400 python3 bench/gpu_attention_mask.py --out $W/attn --repeats 21 2>&1 | tee $W/attn.log | grep -v "^DEBUG"
echo "attn rc=${PIPESTATUS[0]}"
tar czf $OUT/call1.tgz -C $W .
