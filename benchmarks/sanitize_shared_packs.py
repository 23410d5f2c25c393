"""Runs the softmax block kernel's plans that cache packs in shared memory (the packs arrive by cp.async and are waited
for where they are first read), forward and backward, for compute-sanitizer; each result is checked against a float64
reference tightly enough that a pack read before its copy landed would fail.

Usage on a GPU machine::

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_shared_packs.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_shared_packs.py
"""

from __future__ import annotations

import torch

import softmax_ops

# Row counts and lengths whose automatic plans keep packs in shared memory on an H100 (explain says "in shared
# memory"): a cooperative grid group, clusters, and one CTA per row; 1000003 and 50257 are peeled rows.
SHAPES = [(64, 151936), (32, 1000003), (100, 262144), (300, 50257)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Relative error of one rounding to the result dtype, with a margin; absolute floors for float16's subnormals.
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 5e-5}
ATOL = {torch.float16: 1e-7, torch.bfloat16: 1e-30, torch.float32: 1e-30}


def has_shared_packs(shape, dtype, op: str) -> bool:
    plan = softmax_ops.explain(shape, dtype, op=op)
    return "in shared memory" in plan and "+ 0 in shared memory" not in plan


def check(name: str, got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, dtype) -> None:
    """|got - ref| <= RTOL x scale + ATOL elementwise (scale: the size of the terms the result is made of)."""
    err = (got.double() - ref).abs()
    bound = RTOL[dtype] * scale + ATOL[dtype]
    worst = (err / bound).max().item()
    if not worst <= 1.0:
        raise AssertionError(f"{name}: error {worst:.3g} x the bound")


def main() -> None:
    checked = 0
    for shape in SHAPES:
        for dtype in DTYPES:
            x = (torch.randn(shape, device="cuda") * 3).to(dtype)
            if has_shared_packs(shape, dtype, "softmax"):
                y = softmax_ops.softmax(x, -1)
                ref = torch.softmax(x.double(), -1)
                check(f"softmax {shape} {dtype}", y, ref, ref, dtype)
                checked += 1
            if has_shared_packs(shape, dtype, "softmax_backward"):
                y = torch.softmax(x.double(), -1).to(dtype)
                grad = torch.randn_like(x)
                dx = torch.ops.softmax_ops.softmax_backward(grad, y, -1, dtype)
                yd, gd = y.double(), grad.double()
                dot = (gd * yd).sum(-1, keepdim=True)
                ref = yd * (gd - dot)
                check(f"softmax_backward {shape} {dtype}", dx, ref, yd * (gd.abs() + dot.abs()), dtype)
                checked += 1
    torch.cuda.synchronize()
    print(f"shared-memory packs: {checked} (op, shape, dtype) cases checked against float64")


if __name__ == "__main__":
    main()
