#!/usr/bin/env bash
# Session 14, GPU call 4 (one H200): issue 23 - mambasim's cut diagnosis (executed against simulated, device- and
# host-side timing of the captured call) for Mamba, Llama and the MMDiT at 8 layers on 104 + 24 SMs; then issue 24's
# 8-layer HF generate (Inductor, tessera default, tessera cuda_graphs=True) if time is left.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-400} - ($(date +%s) - T0) )); }
echo "== cut diagnose $(left) s left"
BUDGET=290 bash docs/results/2026-12-02-s14-mambasim/gpu_command.sh
if [ $(left) -gt 100 ]; then
  echo "== llama 8 layers $(left) s left"
  mkdir -p $OUT/bd
  timeout $(( $(left) - 5 )) python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 8 \
    --cases inductor,tessera,tessera+graphs --repeats 5 --split --result $OUT/bd/layers_8.json 2>&1 | grep "^\[layers"
fi
echo "== end $(left) s left"
