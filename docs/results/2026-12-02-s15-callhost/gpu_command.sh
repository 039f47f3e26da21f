# commit 65e4294 (branch callhost, or later on it): run from the repo root on one H200 (torch 2.11 / triton 3.6); output under $OUT; ~3.5 min (limit 260 s).
# Issue 23, session 15: executed against simulated for Mamba, Llama and the MMDiT (8 layers) on cuda:0@104sm,cuda:0@24sm
# after the captured call's host work was cut (runtime/inputcheck: inputs checked in full once, then by a fingerprint);
# more host-timed calls where a step is short (--min-timed-s), and the call's host cost measured in the same run
# (bench/gpu_cut_diagnose.py measured_call: each cd_M/cut_diagnose.md's call table gives executed / simulated without
# it, with the graph overlap, and with overlap + that CallCost). Same plans and modes as session 14's gpu_command.sh.
# One process per model (a CUDA error in one leaves the others); Mamba first (the model that missed).
T0=$(date +%s); left() { echo $(( ${BUDGET:-260} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
lscpu | grep -i "model name\|^CPU(s)"; cat /proc/loadavg; git log --oneline 2>/dev/null | head -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
run_model() {  # model plans seconds
  echo "== $1 $(left) s left"
  timeout $3 python3 bench/gpu_cut_diagnose.py --out $OUT/cd_$1 --devices cuda:0@104sm,cuda:0@24sm --model $1 \
    --layers 8 --plans $2 --modes captured,no-wait,alone --no-eager --rounds 2 --calls 3 --min-timed-s 0.3 \
    --cost-repeats 5 --budget-s $(( $3 - 20 )) 2>&1 \
    | grep -v "^DEBUG\|lru_cache\|originates\|warn_once\|modeling_mamba\|is_\|^$\|falling back" \
    | grep -v ": round \|timer ready\|first call\|second call\| done$" | tail -25
  echo "$1 rc=${PIPESTATUS[0]}"
  grep "^|\|host work outside" $OUT/cd_$1/cut_diagnose.md 2>/dev/null
}
run_model mamba tessera,homo-L,request-dist 100
run_model llama tessera,af,homo-L,request-dist $(( $(left) > 170 ? 75 : $(left) / 2 ))
run_model dit tessera,homo-L,request-dist $(( $(left) - 5 ))
cat /proc/loadavg
if [ $(left) -gt 60 ]; then  # this host's CPU: the captured call's host work with the CPU stand-in graph (tiny models)
  echo "== host_per_call $(left) s left"
  timeout $(( $(left) - 10 )) python3 docs/results/2026-12-02-s15-callhost/host_per_call.py --calls 500 --warm 50 \
    --json $OUT/host_per_call.json 2>&1 | grep "inputs\|load"
fi
echo "== end $(left) s left"
