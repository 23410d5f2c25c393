"""The block family's chunk producer (block, split_row, split_hist's fallback) on aligned rows, for
compute-sanitizer.

Usage on a GPU machine:
    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_topk_chunk.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_topk_chunk.py
Rows of one tile, of several tiles and with a ragged last tile (split_row also on many rows: few chunks of
several tiles); k = 1, 50 (the first tile's floor) and 300 (no floor); an all-equal row floods the candidate
buffer (compactions). Each result is checked against torch.topk of the float64 softmax's values: a silent wrong
answer fails as well as a bad access.
"""

from __future__ import annotations

import torch

import softmax_ops

SHAPES = [(2, 4096), (3, 40000), (2, 70008)]
# split_row with few chunks per row (2 CTAs per SM over all rows): chunks of 5 long tiles (8192 elements; 4 and a
# partial one in the last chunk) for 16-bit rows.
SPLIT_ROW_SHAPES = [(52, 200000)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def main() -> None:
    runs = 0
    for kernel in ("block", "split_row", "split_hist"):
        with softmax_ops.force_kernel("topk", kernel):
            for rows, n in SHAPES + (SPLIT_ROW_SHAPES if kernel == "split_row" else []):
                for dtype in DTYPES:
                    x = (torch.randn((rows, n), device="cuda", dtype=torch.float64) * 3).to(dtype)
                    x[-1] = 0.5  # all equal: every value ties with the floor
                    for k in (1, 50, 300):
                        values, indices = softmax_ops.fused_topk(x, k, -1, False)
                        expected = torch.topk(torch.softmax(x.double(), -1), k, -1).values
                        assert torch.allclose(values.double(), expected, rtol=2e-2, atol=1e-6), (
                            kernel,
                            n,
                            dtype,
                            k,
                        )
                        assert bool((indices >= 0).all()) and bool((indices < n).all())
                        runs += 1
    torch.cuda.synchronize()
    print(f"chunk producer: {runs} runs checked")


if __name__ == "__main__":
    main()
