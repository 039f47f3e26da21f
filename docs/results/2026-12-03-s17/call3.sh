#!/usr/bin/env bash
# Session 17, GPU call 3 (one H200): the MMDiT's layer norms _19/_21/_24/_25/_26 alone (warm, L2 flushed, after a
# dirty 50 MB write), whole GPU and 16 SMs: is their 1.8x spread in the program a property of the kernel or of what
# ran before it?
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=/tmp/call3; mkdir -p $W/kt
tar xzf docs/results/2026-12-02-s11/call1_kt/kernel_times.tar.gz -C $W/kt
P=$(find $W/kt -name dit_denoise.program.json | head -1); echo "program $P"
timeout 300 python3 docs/results/2026-12-03-s17/norm_context.py --program $P --out $W/norm 2>&1 | grep -v "^DEBUG" | tee $W/norm.log
tar czf $OUT/call3.tgz -C $W norm norm.log
