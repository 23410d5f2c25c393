#!/usr/bin/env bash
# Quack (quack-kernels 0.6.5) for the bench on the device machine, which has no network and takes a limited working
# tree per call (64 MiB by its README, tracked files included: the tree was 51.7 MB in session 47, when calls carrying
# a 16 MB piece were refused, and 34 MB once superseded plots left it). Quack needs the CuTe DSL (nvidia-cutlass-dsl 4.8.1), whose CUDA 13 libraries come in a
# 92 MB wheel (a stripped 189 MB MLIR module). Its files travel xz-compressed (64 MB) in PARTS pieces (default 4,
# ~16 MB each), one per call, on the same warm machine; the small wheels (8 MB) travel with the first piece.
#
#   bash benchmarks/pack_quack.sh pack [PARTS]  # here: download, compress, split into .quack-1 .. .quack-PARTS
#   bash benchmarks/pack_quack.sh stash         # device, each call (carry its .quack-I): keep it in build/quack-stash
#   bash benchmarks/pack_quack.sh install       # device, after the last stash: unpack and install into /tmp/site
#
# Each call must start before the machine's idle release (status: idle_release_s, 30 s in session 46), so have them
# ready; build/ is ignored, and ignored files on the device stay between calls while it is held. After install:
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# (the DSL's .pth file, which adds dsl_packages, is read only in site-packages, not in a PYTHONPATH folder), then
# `python3 -m softmax_ops bench --compare eager,compile,quack ...`: Quack's softmax forward and backward race
# ours, and on fused_topk rows its router top-k races fused_topk(x, k, -1, True) (benchmarks/README.md).
# cuda-bindings, protobuf and einops are on the device image already (KINDS.md's package list).
set -euo pipefail
repo=$(cd -- "$(dirname "$0")/.." >/dev/null && pwd)
stash_dir=$repo/build/quack-stash
libs=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl

pack() {
  local parts=${1:-4} work i
  work=$(mktemp -d)
  # --no-deps: each need named, in the versions Quack 0.6.5 asks for (its METADATA and the DSL's).
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work" quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 \
    torch-c-dlpack-ext==0.1.5
  mkdir -p "$work/files"
  (cd "$work/files" && python3 -m zipfile -e "$work/$libs" .)
  echo "pack_quack: compressing the DSL's libraries (xz -9, a few minutes)"
  tar -C "$work/files" -cf - . | xz -9 -T0 > "$work/libs.tar.xz"
  rm -rf "$repo"/.quack-*
  (cd "$work" && split -n "$parts" -d -a 2 libs.tar.xz libs.tar.xz.part)
  for i in $(seq 1 "$parts"); do
    mkdir -p "$repo/.quack-$i"
    mv "$work/libs.tar.xz.part$(printf %02d $((i - 1)))" "$repo/.quack-$i/"
  done
  find "$work" -maxdepth 1 -name '*.whl' ! -name "$libs" -exec mv {} "$repo/.quack-1/" \;
  (cd "$work" && sha256sum libs.tar.xz | sed "s/libs.tar.xz/$parts parts/") > "$repo/.quack-1/manifest"
  rm -rf "$work"
  du -sh "$repo"/.quack-*
  git -C "$repo" check-ignore -q "$repo/.quack-1" || echo "pack_quack: note: git does not ignore .quack-1/; keep it out of commits"
}

stash() {
  mkdir -p "$stash_dir"
  local found=0 dir
  for dir in "$repo"/.quack-*/; do
    [ -d "$dir" ] || continue
    cp "$dir"* "$stash_dir/"
    found=1
  done
  [ "$found" = 1 ] || { echo "pack_quack: no .quack-* folder was carried" >&2; exit 1; }
  ls -la "$stash_dir"
}

install() {
  [ -f "$stash_dir/manifest" ] || { echo "pack_quack: no manifest stashed (the first part's call?)" >&2; exit 1; }
  local sum parts
  read -r sum parts _ < "$stash_dir/manifest"
  local have
  have=$(find "$stash_dir" -name 'libs.tar.xz.part*' | wc -l)
  if [ "$have" != "$parts" ]; then
    echo "pack_quack: $have of $parts parts stashed (were all calls on the same warm machine?)" >&2
    exit 1
  fi
  if [ "$(cat "$stash_dir"/libs.tar.xz.part* | sha256sum | cut -d' ' -f1)" != "$sum" ]; then
    echo "pack_quack: the parts do not add up to the packed archive (sha256)" >&2
    exit 1
  fi
  mkdir -p /tmp/site
  cat "$stash_dir"/libs.tar.xz.part* | python3 -c \
    "import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode='r|').extractall('/tmp/site', filter='data')"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$stash_dir"/*.whl
  PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages python3 -c \
    "import quack, quack.softmax, quack.topk; print('pack_quack: quack', quack.__version__, 'imports')"
}

case ${1:-} in
  pack) pack "${2:-4}" ;;
  stash | install) "$1" ;;
  *) echo "usage: bash benchmarks/pack_quack.sh pack [PARTS] | stash | install" >&2; exit 2 ;;
esac
