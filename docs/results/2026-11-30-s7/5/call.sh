#!/bin/bash
# session 7 call 5: issue 9 - measured bench rows with the final code: dit at 24 SMs (README row predates the per-hop charge), mamba and dit at 72 SMs (second profile)
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 555 - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
R=/tmp/res7e; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
for job in "d24 dit 24" "m72 mamba 72" "d72 dit 72"; do
  set -- $job
  extra=""; [ $2 = mamba ] && extra="--prefill-tokens 16"
  if [ $(left) -gt 100 ]; then
    echo "== $1 $(date +%T)" >> $R/log.txt
    timeout $(( $(left) - 10 )) python3 -m torch_tessera.cli bench --measure --size full --layers 8 --model $2 --devices cuda:0,cuda:1@$3sm $extra --out $R/$1 > $R/$1.log 2>&1
    echo "rc=$? $(date +%T)" >> $R/log.txt
  fi
done
cp scratch_gpu/c5.sh $R/call.sh
cd $R && tar czf $OUT/c5.tgz $(find . -type f -size -5M) ; ls -la $OUT
cat $R/log.txt; for f in $R/*.log; do grep -A12 "^MEASURED" $f | cut -c1-200; done
