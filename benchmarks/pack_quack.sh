#!/usr/bin/env bash
# Quack (quack-kernels 0.6.5) for the bench on the device machine, which has no network and takes at most 64 MiB
# per call, the working tree included. Quack needs the CuTe DSL (nvidia-cutlass-dsl 4.8.1), whose CUDA 13
# libraries come in a 92 MB wheel (a stripped 189 MB MLIR module): too much for one call. Its files travel
# xz-compressed (64 MB) in two halves, carried by two calls on the same warm machine.
#
#   bash benchmarks/pack_quack.sh pack      # here: download, compress, split into .whl/quack-1 and .whl/quack-2
#   bash benchmarks/pack_quack.sh stash     # device, call 1 (carry .whl/quack-1): keep half 1 in build/quack-stash
#   bash benchmarks/pack_quack.sh install   # device, call 2 (carry .whl/quack-2): unpack and install into /tmp/site
#
# Call 2 must start before the machine's idle release (status: idle_release_s, 30 s in session 46), so have it
# ready; build/ is ignored, and ignored files on the device stay between calls while it is held. After install:
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# (the DSL's .pth file, which adds dsl_packages, is read only in site-packages, not in a PYTHONPATH folder), then
# `python3 -m softmax_ops bench --compare eager,compile,quack ...`: Quack's softmax forward and backward race
# ours, and on fused_topk rows its router top-k races fused_topk(x, k, -1, True) (benchmarks/README.md).
# cuda-bindings, protobuf and einops are on the device image already (KINDS.md's package list).
set -euo pipefail
repo=$(cd -- "$(dirname "$0")/.." >/dev/null && pwd)
half1=$repo/.whl/quack-1
half2=$repo/.whl/quack-2
stash=$repo/build/quack-stash
libs=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl

pack() {
  local work
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
  rm -rf "$half1" "$half2"
  mkdir -p "$half1" "$half2"
  (cd "$work" && split -n 2 -d libs.tar.xz libs.tar.xz.part)
  mv "$work/libs.tar.xz.part00" "$half1/"
  mv "$work/libs.tar.xz.part01" "$half2/"
  find "$work" -maxdepth 1 -name '*.whl' ! -name "$libs" -exec mv {} "$half2/" \;
  rm -rf "$work"
  du -sh "$half1" "$half2"
  git -C "$repo" check-ignore -q "$half1" || echo "pack_quack: note: git does not ignore .whl/; keep it out of commits"
}

stash() {
  mkdir -p "$stash"
  cp "$half1"/libs.tar.xz.part00 "$stash/"
  ls -la "$stash"
}

install() {
  local first=$stash/libs.tar.xz.part00
  [ -f "$first" ] || first=$half1/libs.tar.xz.part00  # the carried folder itself, where it stayed too
  if [ ! -f "$first" ]; then
    echo "pack_quack: half 1 is not on this machine (was call 1 on the same warm machine?)" >&2
    exit 1
  fi
  mkdir -p /tmp/site
  cat "$first" "$half2/libs.tar.xz.part01" | python3 -c \
    "import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode='r|').extractall('/tmp/site', filter='data')"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$half2"/*.whl
  PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages python3 -c \
    "import quack.softmax, quack.topk; print('pack_quack: quack', quack.__version__, 'imports')"
}

case ${1:-} in
  pack | stash | install) "$1" ;;
  *) echo "usage: bash benchmarks/pack_quack.sh pack|stash|install" >&2; exit 2 ;;
esac
