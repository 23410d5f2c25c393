#!/usr/bin/env bash
# A/B of the working tree against a base revision with a tune script, in one GPU call.
#
#   bash benchmarks/ab_tune.sh BASE OUT_DIR [tune script arguments...]
#   bash benchmarks/ab_tune.sh HEAD $OUT/ab --cases 1024x50000k50,64x151936k50 --kernels block,split_row
#
# BASE is a git revision, or a directory holding the base tree (softmax_ops, csrc, meta, pyproject.toml): the
# device machine's copy of the repository has no git history, so there the base travels as files, e.g.
#   git archive HEAD softmax_ops csrc meta pyproject.toml | tar x -C .ab-base    (here, before the call)
#   bash benchmarks/ab_tune.sh .ab-base $OUT/ab ...                               (on the device)
# (an untracked directory travels with the working tree; delete it afterwards). OUT_DIR ends up packed as
# OUT_DIR.tar.gz too: the device tool returns only a few files per call.
#
# The base tree and the working tree are built at once, each with its own SOFTMAX_OPS_CACHE (the working tree's
# is NEW_CACHE when set, so that later commands of the call reuse its build; a directory base's BASE_CACHE, so that
# a second ab_tune.sh against it, or its own tests, do; give both, and OUT_DIR, as absolute paths: each side runs in
# its own tree). Then the working tree's tune script
# (TUNE, default tune_topk.py; tune_softmax.py works the same way), so that both sides are measured by the same code
# (but each side's own make_timer: a base from before session 36's events timer is timed with do_bench, and
# compare_bench.py then says so first), runs on base and new in turns, RUNS times each (default 2):
# OUT_DIR/{base,new}<i>.{json,txt}. compare_bench.py's per-case comparison of all runs ends up in OUT_DIR/compare.txt
# and on stdout (COMPARE_ARGS, e.g. --time, are passed to it). Small shapes move by ~10% between runs of the same
# code: read the runs, not only the mean change.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/ab_tune.sh BASE OUT_DIR [tune script arguments...]" >&2
  exit 2
fi
base_rev=$1
out=$2
shift 2
repo=$(cd -- "$(dirname "$0")/.." >/dev/null && pwd)
tune=$repo/benchmarks/${TUNE:-tune_topk.py}
runs=${RUNS:-2}
work=$(mktemp -d)
mkdir -p "$out"
trap 'tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"' EXIT  # whatever the outcome
# A directory BASE is used in place: torch's build file names its sources by absolute path, so a build cache
# (BASE_CACHE) is reused only by the same tree at the same place -- a second ab_tune.sh, or the base's own tests.
if [ -d "$base_rev" ]; then
  base_tree=$(cd -- "$base_rev" >/dev/null && pwd)
else
  base_tree=$work/base
  mkdir -p "$base_tree"
  git -C "$repo" archive "$base_rev" softmax_ops csrc meta pyproject.toml | tar x -C "$base_tree" || exit 1
fi

# side NAME TREE COMMAND...: COMMAND in TREE with that tree's package and build cache.
side() {
  local name=$1 tree=$2 cache=$work/cache-$1
  shift 2
  [ "$name" = new ] && cache=${NEW_CACHE:-$cache}
  [ "$name" = base ] && cache=${BASE_CACHE:-$cache}
  (cd "$tree" && SOFTMAX_OPS_CACHE="$cache" PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$@")
}

echo "ab_tune: building $base_rev and the working tree"
side base "$base_tree" python3 -c "import softmax_ops" > "$out/build-base.log" 2>&1 &
side new "$repo" python3 -c "import softmax_ops" > "$out/build-new.log" 2>&1 &
wait
for i in $(seq 1 "$runs"); do
  for name in base new; do
    tree=$base_tree
    [ "$name" = new ] && tree=$repo
    echo "ab_tune: run $i of $runs, $name"
    side "$name" "$tree" python3 "$tune" "$@" --json "$out/$name$i.json" > "$out/$name$i.txt" 2>&1 \
      || echo "ab_tune: $name run $i failed (see $out/$name$i.txt)"
  done
done
# The JSON files a side wrote, comma-separated (a failed run writes none).
list() {
  local name=$1 files="" i
  for i in $(seq 1 "$runs"); do
    [ -f "$out/$name$i.json" ] && files+="${files:+,}$out/$name$i.json"
  done
  echo "$files"
}
if [ -z "$(list base)" ] || [ -z "$(list new)" ]; then
  echo "ab_tune: no comparison (a side has no successful run)" | tee "$out/compare.txt"
  exit 1
fi
python3 "$repo/benchmarks/compare_bench.py" ${COMPARE_ARGS:-} --base "$(list base)" --new "$(list new)" | tee "$out/compare.txt"
