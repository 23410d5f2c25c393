"""Writes softmax_ops.explain() for a fixed grid of cases, one block per case, so that two trees' dispatchers can
be compared with `diff` (a refactor must leave every block identical; a rule change shows the plans it moves).

Works without a GPU (explain then assumes an H100). The grid: every op (softmax, log_softmax, their backward,
fused_topk and its backward), fp16 / bf16 / fp32 / fp64, the automatic choice and every kernel of the family
forced, on PERF.md's sweep shapes plus row lengths at and around the warp, lean, block and few-rows limits,
lengths that break 16-byte packs, and a non-last dim.

    SOFTMAX_OPS_CACHE=/tmp/cacheA PYTHONPATH=$PWD python3 benchmarks/explain_snapshot.py /tmp/explain-new.txt
    (the same from the base tree into /tmp/explain-base.txt) && diff /tmp/explain-base.txt /tmp/explain-new.txt

With --reverse the cases are asked in the opposite order (and written in the same order). On a GPU the dispatcher
asks the occupancy API, whose answers must not depend on what the process asked or ran before: a forward and a
reverse snapshot in two fresh processes must be identical.
"""
from __future__ import annotations

import sys

import torch

import softmax_ops

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
SOFTMAX_OPS = ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward")
FAMILY = {"softmax": "softmax", "log_softmax": "softmax", "softmax_backward": "softmax_backward",
          "log_softmax_backward": "softmax_backward", "fused_topk": "topk", "fused_topk_backward": "topk_backward"}
SWEEP = [(128, 1024), (2048, 1024), (2048, 2048), (2048, 4096), (2048, 8192), (4, 16384), (4, 32768), (4, 65536),
         (4, 114688), (4, 262144), (4, 1048576), (4, 8388608), (4, 33554432), (4096, 4096), (2048, 131072),
         (32768, 2048), (16384, 128), (65536, 64), (64, 151936), (8, 262144), (1000, 1000), (3, 100003)]
# Row lengths around the kernels' limits (8 / 16 / 32 packs per lane, 2048-8192 lean columns, 32 x 8 packs), odd
# lengths (peeled rows, single elements) and row counts around the SM count.
LENGTHS = [1, 2, 7, 8, 9, 30, 33, 60, 64, 100, 127, 128, 255, 256, 257, 511, 512, 513, 1023, 1025, 2047, 2049, 4095,
           4097, 6143, 6144, 8191, 8193, 16383, 50257]
ROWS = [1, 37, 131, 133, 1024, 65536]
TOPK = [((16384, 8), 2), ((16384, 60), 4), ((16384, 64), 6), ((16384, 160), 6), ((65536, 256), 8), ((16384, 512), 8),
        ((4096, 1000), 16), ((1024, 50000), 50), ((1, 128256), 50), ((64, 151936), 50), ((8, 262144), 1024),
        ((3, 100003), 7), ((256, 128), 128)]


def cases():
    """(op, shape, dim, k) in a fixed order."""
    shapes = SWEEP + [(r, n) for r in ROWS for n in LENGTHS if r * n <= 2**28]
    for op in SOFTMAX_OPS:
        for shape in shapes:
            yield op, shape, -1, 0
        yield op, (64, 1000, 32), 1, 0  # a non-last dim
    for op in ("fused_topk", "fused_topk_backward"):
        for shape, k in TOPK:
            yield op, shape, -1, k


def explain(op, shape, dtype, dim, k, family, kernel):
    """explain()'s text, or the error a forced top-k kernel raises for a case it cannot run."""
    try:
        if kernel is None:
            return softmax_ops.explain(shape, dtype, op=op, dim=dim, k=k)
        with softmax_ops.force_kernel(family, kernel):
            return softmax_ops.explain(shape, dtype, op=op, dim=dim, k=k)
    except (RuntimeError, ValueError) as error:
        return f"raises {type(error).__name__}: {error}"


def main() -> None:
    args = sys.argv[1:]
    reverse = "--reverse" in args
    paths = [a for a in args if a != "--reverse"]
    if len(paths) != 1 or len(args) > 2:
        sys.exit(__doc__)
    blocks = [(op, shape, dim, k, FAMILY[op], kernel, name, dtype)
              for op, shape, dim, k in cases()
              for kernel in [None] + softmax_ops.list_kernels(FAMILY[op])
              for name, dtype in DTYPES.items()]
    order = range(len(blocks) - 1, -1, -1) if reverse else range(len(blocks))
    texts = [""] * len(blocks)
    for i in order:
        op, shape, dim, k, family, kernel, _, dtype = blocks[i]
        texts[i] = explain(op, shape, dtype, dim, k, family, kernel)
    with open(paths[0], "w") as out:
        for (op, shape, dim, k, _, kernel, name, _), text in zip(blocks, texts):
            out.write(f"== {op} {list(shape)} dim={dim} k={k} {name} forced={kernel or '-'}\n{text}\n")
    print(f"{len(blocks)} cases written to {paths[0]}" + (" (asked in reverse order)" if reverse else ""))


if __name__ == "__main__":
    main()
