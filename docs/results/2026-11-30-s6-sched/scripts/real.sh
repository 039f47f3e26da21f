#!/bin/bash
# usage: real.sh ROUNDS RUNS  -- alternates base (5ec288d) and new (sched6) per model and device count
D4=sim:a100,sim:l40s,sim:h100,sim:rtxpro6000
for r in $(seq ${START:-1} $1); do
for m in "llama /tmp/s6/llama_1024.pkl" "moe /tmp/s6/moe_1024.pkl" "mamba /tmp/s6/mamba_16.pkl"; do
  set -- $m; name=$1; pk=$2
  for devs in sim:a100,sim:l40s $D4; do
    for tag in base new; do
      root=/tmp/s6/base; [ $tag = new ] && root=/work/wt-sched
      echo "== r$r $(date +%T) $tag $name $devs (load $(cut -d' ' -f1 /proc/loadavg))"
      (cd $root && PYTHONPATH=. python bench/time_trim.py $name $devs --pickle $pk --runs ${RUNS:-5} --trim-only | tail -1)
    done
  done
done
done
