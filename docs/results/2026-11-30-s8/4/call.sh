#!/bin/bash
# session 8 call 4: issue 9 - request streams served from their own GPU (stream r: model, inputs, state and home on GPU r; a partition home replays without a host wait): MMDiT 72, Llama 24, Mamba 24
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
left() { echo $(( 515 - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
R=/tmp/res8d; rm -rf $R; mkdir -p $R
pip install -q --no-deps --no-build-isolation -e . > $R/pip.txt 2>&1
for job in "d72s dit 72" "l24s llama 24" "m24s mamba 24"; do
  set -- $job
  extra=""; [ $2 = mamba ] && extra="--prefill-tokens 16"
  if [ $(left) -gt 125 ]; then
    echo "== $1 $(date +%T)" >> $R/log.txt
    timeout $(( $(left) - 8 )) python3 -m torch_tessera.cli bench --measure --streams --size full --layers 8 --model $2 --devices cuda:0,cuda:1@$3sm $extra --out $R/$1 > $R/$1.log 2>&1
    echo "rc=$? $(date +%T)" >> $R/log.txt
  fi
done
cp scratch_gpu/c4.sh $R/call.sh
cd $R && tar czf $OUT/c4.tgz $(find . -type f -size -5M) ; ls -la $OUT
cat $R/log.txt; for f in $R/*.log; do echo "#### $f"; grep -i -E "differ in the last|Traceback|Error" $f | cut -c1-300 | head -5; grep -A13 "^MEASURED" $f | cut -c1-250; done
