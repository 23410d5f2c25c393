"""How often the backward ops' error misses DESIGN.md §3's accuracy rule, over many random inputs.

The tests check one input per case against "at most twice torch's own error (vs float64) plus one output rounding
step" (tests/conftest.py assert_within_2x_torch). Whether a change to the backward's row sum (float instead of double
accumulation, another reduction order) keeps that rule is a question about the distribution, not one input: this
prints, per (op, dtype, shape), over SEEDS inputs built as tests/test_cuda_softmax.py's check_backward builds them
(torch's forward output, a unit-normal gradient), the largest ratio of our error to the rule's bound, how many
inputs miss it (ratio > 1), and the median of our error over torch's. One GPU call, either tree:

    python3 benchmarks/diag_backward_sum_accuracy.py [--seeds 20] [--shapes 1x128,128x1024] [--dtypes fp32] \
        [--ops softmax,log_softmax]

(--ops names the forward whose backward is measured: softmax -> softmax_backward.)
"""

from __future__ import annotations

import argparse
import statistics

import torch

import softmax_ops  # noqa: F401  (registers torch.ops.softmax_ops)
from softmax_ops._bench_cases import DTYPES, parse_dtypes, parse_shapes
from softmax_ops._bench_impls import _bound, _max_error  # the bench's form of the tests' rule

DEFAULT_SHAPES = "1x128,3x500,4x1024,128x1024,1000x1000,16384x128,65536x64,8x4096,64x8192,4x65536,3x100003"


# As tests/test_cuda_softmax.py's make_input: float64 normals from a CPU generator, rounded to the dtype.
def random_tensor(shape, dtype, seed: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype).to("cuda")


def error_ratio(op: str, shape, dtype, seed: int) -> tuple[float, float, float]:
    """(our error, torch's error, the rule's bound) on one input, all vs the float64 backward on the same inputs."""
    x = random_tensor(shape, dtype, seed, 3.0)
    y = torch.softmax(x, -1) if op == "softmax" else torch.log_softmax(x, -1)
    grad = random_tensor(shape, dtype, seed + 10_000, 1.0)
    if op == "softmax":
        ours = torch.ops.softmax_ops.softmax_backward(grad, y, -1, dtype)
        torch_own = torch._softmax_backward_data(grad, y, -1, dtype)
    else:
        ours = torch.ops.softmax_ops.log_softmax_backward(grad, y, -1, dtype)
        torch_own = torch._log_softmax_backward_data(grad, y, -1, dtype)
    y64, g64 = y.double().cpu(), grad.double().cpu()
    if op == "softmax":
        reference = y64 * (g64 - (g64 * y64).sum(-1, keepdim=True))
    else:
        reference = g64 - torch.exp(y64) * g64.sum(-1, keepdim=True)
    our_err = _max_error(ours.cpu(), reference)
    torch_err = _max_error(torch_own.cpu(), reference)
    return our_err, torch_err, _bound(torch_err, dtype, reference.abs().max().item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--dtypes", default="fp32,fp16")
    parser.add_argument("--ops", default="softmax,log_softmax")
    args = parser.parse_args()
    print(f"{'op':<20} {'dtype':<5} {'shape':<11} {'max ratio':>9} {'misses':>6} {'median ours/torch':>17}")
    for op in args.ops.split(","):
        for dtype_name in parse_dtypes(args.dtypes):
            for rows, n, _ in parse_shapes(args.shapes):
                shape_text = f"{rows}x{n}"
                results = [error_ratio(op, (rows, n), DTYPES[dtype_name], seed) for seed in range(args.seeds)]
                ratios = [ours / bound for ours, _, bound in results]
                relative = [ours / torch_err for ours, torch_err, _ in results if torch_err > 0]
                median = statistics.median(relative) if relative else float("nan")
                misses = sum(ratio > 1 for ratio in ratios)
                print(f"{op + '_backward':<20} {dtype_name:<5} {shape_text:<11} {max(ratios):>9.3f} {misses:>6} "
                      f"{median:>17.3f}", flush=True)


if __name__ == "__main__":
    main()
