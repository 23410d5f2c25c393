"""Where a fused_topk accuracy failure comes from: a wrong selection, or a wrong sum (divisor).

For each forced kernel it finds the worst (row, rank) against a float64 reference and prints whether the
selected index set differs from the reference's, and the relative error of the divisor the kernel must have
used (its top value against exp(x_top - max) / sum in float64). Same input as the bench
(``randn * 3``, seed 0). One GPU call::

    python3 benchmarks/diag_topk_accuracy.py --shape 1024x50000 --k 50 --dtype fp32
"""

from __future__ import annotations

import argparse

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1024x50000")
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--kernels", default="block,split_row,radix")
    args = parser.parse_args()

    import torch

    import softmax_ops
    from softmax_ops._bench_impls import _random

    rows, cols = (int(v) for v in args.shape.split("x"))
    dtype = getattr(torch, DTYPES[args.dtype])
    x = _random((rows, cols), dtype, torch.device("cuda"), seed=0)
    probabilities = torch.softmax(x.double(), -1)
    reference = torch.topk(probabilities, args.k, dim=-1)
    eager = torch.topk(torch.softmax(x, -1, dtype=torch.float32), args.k, dim=-1)
    print(f"torch eager max error {(eager.values.double() - reference.values).abs().max().item():.3e}")
    for kernel in args.kernels.split(","):
        with softmax_ops.force_kernel("topk", kernel):
            values, indices = softmax_ops.fused_topk(x, args.k, -1, False, torch.float32)
        error = (values.double() - reference.values).abs()
        worst = int(error.max(dim=-1).values.argmax())
        rank = int(error[worst].argmax())
        same_set = torch.equal(indices[worst].sort().values, reference.indices[worst].sort().values)
        # The divisor the kernel used, from its top value: p0 = exp(x0 - max) / divisor.
        row = x[worst].double()
        exact_sum = torch.exp(row - row.max()).sum()
        top = row[indices[worst, 0]]
        implied_sum = torch.exp(top - row.max()) / values[worst, 0].double()
        wrong_sets = sum(
            not torch.equal(indices[r].sort().values, reference.indices[r].sort().values) for r in range(rows)
        )
        print(f"{kernel}: max error {error.max().item():.3e} at row {worst} rank {rank} "
              f"(value {values[worst, rank].item():.6e}, reference {reference.values[worst, rank].item():.6e}); "
              f"same index set in that row: {same_set}; rows with a different index set: {wrong_sets}; "
              f"divisor relative error {((implied_sum - exact_sum) / exact_sum).item():.3e}; "
              f"p_top {values[worst, 0].item():.4f}")


if __name__ == "__main__":
    main()
