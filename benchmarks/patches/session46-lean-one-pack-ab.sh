#!/usr/bin/env bash
# The lean one-pack form's A/B call: session 46's call 1 (its results: results/*session46-c1-*). To repeat it on the
# tree before that form landed (7e6a9a5), here, before the call:
#   git apply benchmarks/patches/session46-lean-one-pack-experiment.patch
#   mkdir .ab-base && git archive HEAD softmax_ops csrc meta pyproject.toml | tar x -C .ab-base
# then on the device: bash benchmarks/patches/session46-lean-one-pack-ab.sh
# A/B of the one-pack form (working tree) against HEAD (.ab-base) on 16-bit rows it takes (many rows of one wave,
# few rows), tune_softmax.py, 3 runs in turns (about 5 minutes with both builds); then the new tree's lean / few-row /
# one-pack GPU tests and the dispatch rules.
set -uo pipefail
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
export PYTHONUNBUFFERED=1 MAX_JOBS=16
head="# lean one-pack A/B (working tree = HEAD + session46-lean-one-pack-experiment.patch; base .ab-base = HEAD; benchmarks/patches/session46-lean-one-pack-ab.sh)"
{ echo "$head"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
SHAPES=2048x1024,1000x1000,2048x512,2048x768,132x1024,1000x2040,200x2040,128x1024,128x4096,64x2048,4x4096,64x1001
export NEW_CACHE=/tmp/cache-new BASE_CACHE=/tmp/cache-base TUNE=tune_softmax.py RUNS=3
{ echo "$head: ab_tune.sh .ab-base, tune_softmax.py --ops softmax,log_softmax --dtypes fp16,bf16 --kernels none --no-eager --shapes $SHAPES (t=$(el) s)"
  timeout 320 bash benchmarks/ab_tune.sh .ab-base $OUT/ab --ops softmax,log_softmax --dtypes fp16,bf16 --kernels none --no-eager --time-budget 50 --shapes $SHAPES 2>&1
  echo "rc $? (t=$(el) s)"; } > $OUT/ab-one-pack.txt 2>&1
[ -f $OUT/ab.tar.gz ] && rm -rf $OUT/ab  # the device returns at most 8 files: the runs come back packed
tail -70 $OUT/ab-one-pack.txt
{ echo "$head: pytest -n 14 tests/test_cuda_softmax.py tests/test_dispatch_rules.py -k 'one_pack or lean or few or offset_maxima or test_dispatch_rules' (t=$(el) s)"
  SOFTMAX_OPS_CACHE=$NEW_CACHE PYTHONPATH=$PWD timeout $(( 490 - $(el) )) python3 -m pytest tests/test_cuda_softmax.py tests/test_dispatch_rules.py -q -n 14 -p no:cacheprovider -rf --tb=short -k "one_pack or lean or few or offset_maxima or test_dispatch_rules" 2>&1 | grep -v PytestBenchmarkWarning | grep -v "warner(" | tail -40
  echo "rc ${PIPESTATUS[0]} (t=$(el) s)"; } > $OUT/pytest-one-pack.txt 2>&1
tail -15 $OUT/pytest-one-pack.txt
