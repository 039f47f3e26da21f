#!/bin/bash
# session 8 call 1: issue 9 - the fill/drain choice (dit 24 SMs, no streams; pinning warnings) and request streams with >= 16 calls per program
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 540 - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
R=/tmp/res8a; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
for job in "d24 dit 24 -" "d72s dit 72 --streams" "m24s mamba 24 --streams" "d24s dit 24 --streams"; do
  set -- $job
  extra=""; [ $2 = mamba ] && extra="--prefill-tokens 16"; [ $4 = - ] || extra="$extra $4"
  if [ $(left) -gt 120 ]; then
    echo "== $1 $(date +%T)" >> $R/log.txt
    timeout $(( $(left) - 10 )) python3 -m torch_tessera.cli bench --measure --size full --layers 8 --model $2 --devices cuda:0,cuda:1@$3sm $extra --out $R/$1 > $R/$1.log 2>&1
    echo "rc=$? $(date +%T)" >> $R/log.txt
  fi
done
cp scratch_gpu/c1.sh $R/call.sh
cd $R && tar czf $OUT/c1.tgz $(find . -type f -size -5M) ; ls -la $OUT
cat $R/log.txt; for f in $R/*.log; do echo "#### $f"; grep -i -E "differ in the last|tessera:|streams" $f | cut -c1-300 | head; grep -B3 -A12 "^MEASURED" $f | cut -c1-220; done
