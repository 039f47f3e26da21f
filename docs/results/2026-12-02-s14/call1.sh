#!/usr/bin/env bash
# Session 14, GPU call 1 (one H200): issue 24 - what a CUDA graph launch costs the host by node count, and the
# 32-layer HF generate under Inductor, tessera's default and tessera with its decode graph cut into a chain of graphs
# (TESSERA_GRAPH_CHUNK), each compiled in one process and timed in round-robin rounds; the host's CPU recorded.
T0=$(date +%s); left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg; git log --oneline 2>/dev/null | head -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "== probe $(left) s left"
timeout 90 python3 docs/results/2026-12-02-s14/graph_chain_probe.py $OUT/probe 2>&1 | tail -30
echo "== llama 32 layers $(left) s left"
mkdir -p $OUT/bd
timeout $(( $(left) - 10 )) python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 32 \
  --cases inductor,tessera,tessera@chunk=48,tessera@chunk=192 --repeats 5 --split --step-loop 20 \
  --result $OUT/bd/layers_32.json 2>&1 | grep "^\[layers" ; echo "bd rc=$?"
echo "== end $(left) s left"
