#!/usr/bin/env bash
# Session 13, GPU call 3 (one H200): issue 24 - one recorded 8-layer decode step called alone (synced, host-only,
# back to back, cProfile) under Inductor and tessera, to split tessera's per-call host time; the host's CPU recorded.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)\|MHz" ; cat /proc/loadavg
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
mkdir -p $OUT/bd
timeout 400 python3 bench/gpu_backend_default.py --out $OUT/bd --one-layers 8 --cases inductor,tessera \
  --repeats 4 --split --step-loop 30 --result $OUT/bd/layers_8.json 2>&1 | grep "^\[layers" ; echo "bd rc=$?"
python3 -c "
import json; d=json.load(open('$OUT/bd/layers_8.json'))
for k, v in d['cases'].items(): print('=====', k); print(v.get('step_loop', {}).get('cprofile_20_calls', '')[:9000])
"
