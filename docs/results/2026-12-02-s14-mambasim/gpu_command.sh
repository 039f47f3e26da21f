# commit 7727099 (branch mambasim): run from the repo root on one H200 (torch 2.11 / triton 3.6); output under $OUT; ~4 min.
# Issue 23, session 14: executed against simulated for Mamba, Llama and the MMDiT (8 layers) on cuda:0@104sm,cuda:0@24sm,
# with the captured replay timed on the host AND on the device (whole call; graph alone), a plain CUDA graph of each
# device's share, each device's program as a plain graph, and per-launch costs three ways (bench/gpu_cut_diagnose.py).
# One process per model (a CUDA error in one leaves the others); Mamba first (the model that misses).
T0=$(date +%s); left() { echo $(( ${BUDGET:-290} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg; git log --oneline 2>/dev/null | head -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
run_model() {  # model plans seconds
  echo "== $1 $(left) s left"
  timeout $3 python3 bench/gpu_cut_diagnose.py --out $OUT/cd_$1 --devices cuda:0@104sm,cuda:0@24sm --model $1 \
    --layers 8 --plans $2 --modes captured,no-wait,alone --no-eager --rounds 2 --calls 3 --cost-repeats 5 \
    --budget-s $(( $3 - 20 )) 2>&1 | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|modeling_mamba\|is_\|^$\|falling back" \
    | grep -v ": round \|timer ready\|first call\|second call\| done$" | tail -25
  echo "$1 rc=${PIPESTATUS[0]}"
  grep "^|" $OUT/cd_$1/cut_diagnose.md 2>/dev/null
}
run_model mamba tessera,homo-L,request-dist 110
run_model llama tessera,af,homo-L,request-dist $(( $(left) > 190 ? 85 : $(left) / 2 ))
run_model dit tessera,homo-L,request-dist $(( $(left) - 5 ))
echo "== end $(left) s left"
