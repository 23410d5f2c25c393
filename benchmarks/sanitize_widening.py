"""Runs every forced softmax-family kernel on 16-bit inputs with float32 results (the widening form, whose results
go out in lane pairs: softmax_kernel_common.cuh, store_pack_where), for compute-sanitizer, and checks each result.

Rows of an odd number of 16-byte packs (a lane pair's last pack has no partner), rows that break packs (peeled),
and the automatic plans of group shapes (cluster and grid groups caching 4 register packs). For the warp kernel
(forced; plans as explain gives them for float16 -> float32): 1 lane per row (8 and 24 columns: no pairs), 2 lanes
(40 and 56: 5 and 7 packs), 4 lanes (72), 8 lanes peeled (75), 32 lanes x 2 packs (296) and x 8 packs (1608).

Usage on a GPU machine: compute-sanitizer --tool memcheck python3 benchmarks/sanitize_widening.py
A forced kernel that cannot handle a shape raises; those combinations are skipped and counted.
"""

from __future__ import annotations

import torch
from sanitize_subset import run_family  # this directory is the script's: on sys.path

import softmax_ops

SHAPES = [(67, 8), (33, 8 * 3), (33, 8 * 5), (33, 8 * 7), (65, 8 * 9), (33, 8 * 9 + 3), (3, 8 * 37), (3, 8 * 201), (5, 8 * 1001), (2, 8 * 4097), (37, 8 * 2049 + 3), (2, 8 * 40001), (1, 300007)]
AUTOMATIC_SHAPES = [(1056, 8 * 2049), (64, 8 * 4749), (9, 8 * 32769)]
DTYPES = [torch.float16, torch.bfloat16]


def check(x: torch.Tensor) -> None:
    for op in ("softmax", "log_softmax"):
        ours = getattr(softmax_ops, op)(x, -1, dtype=torch.float32)
        expected = getattr(torch, op)(x, -1, dtype=torch.float32)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def main() -> None:
    ran, skipped = run_family("softmax", check, SHAPES, DTYPES,
                              lambda shape, dtype: (torch.randn(shape, device="cuda") * 3).to(dtype))
    for shape in AUTOMATIC_SHAPES:
        for dtype in DTYPES:
            check((torch.randn(shape, device="cuda") * 3).to(dtype))
            ran += 1
    torch.cuda.synchronize()
    print(f"widening: {ran} checked, {skipped} skipped (a forced kernel that cannot take the shape)")


if __name__ == "__main__":
    main()
