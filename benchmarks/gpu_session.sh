#!/usr/bin/env bash
# One device-machine call: build, GPU tests, sanitizer subset, bench, demo. Everything it prints also
# lands under $OUT (logs, bench JSON). Usage: bash benchmarks/gpu_session.sh [stages...]
# stages: env build test sanitize bench demo (default: all). Wheels for missing packages come from .whl/.
set -uo pipefail
OUT=${OUT:-/tmp/softmax_ops_out}
mkdir -p "$OUT"
stages=${*:-"env build test sanitize bench demo"}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} SOFTMAX_OPS_VERBOSE_BUILD=${SOFTMAX_OPS_VERBOSE_BUILD:-0}
# The >2^31-element tests need ~40 GB of GPU memory: on by default on the device machines (H100/H200).
export SOFTMAX_OPS_BIG_TESTS=${SOFTMAX_OPS_BIG_TESTS:-1}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "=== $1"; shift; "$@"; }
for stage in $stages; do
  case $stage in
    env) run env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch,sys;print(sys.version);print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"' 2>&1 | tee "$OUT/env.log" ;;
    build) run build bash -c 'time python3 -c "import softmax_ops, torch; print(softmax_ops.list_kernels(\"softmax\"), softmax_ops.list_kernels(\"topk\"))"' 2>&1 | tee "$OUT/build.log" | tail -40 ;;
    probe) run probe python3 benchmarks/explain_probe.py 2>&1 | tee "$OUT/probe.log" | tail -40 ;;
    # One pytest process per file: a crash in one file must not hide the results of the others.
    test) for f in ${TEST_FILES:-tests/test_*.py}; do
            run "test $f" bash -c "python3 -X faulthandler -m pytest $f -q --timeout=600 -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee $OUT/pytest-$(basename $f .py).log | tail -${TEST_TAIL:-25}"
          done ;;
    sanitize) run sanitize bash -c "compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_subset.py 2>&1 | tail -30 | tee $OUT/sanitize.log" ;;
    bench) run bench bash -c "python3 -m softmax_ops bench ${BENCH_ARGS:-} --json $OUT/bench.json 2>&1 | tee $OUT/bench.log | tail -120" ;;
    demo) run demo bash -c "python3 -m softmax_ops 2>&1 | tee $OUT/demo.log | tail -40" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
