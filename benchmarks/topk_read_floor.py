"""The floor of a fused_topk shape: the fastest Triton kernel found that reads every logit once (a row max) and
writes k float32 values and k int64 indices per row, timed like the bench (do_bench, L2 flushed), next to
x.sum(-1) (the bench's xSum yardstick). Not a top-k: it bounds what any fused_topk kernel can reach on that
shape (launch, latency and bytes). One GPU call (Triton needed)::

    python3 benchmarks/topk_read_floor.py > $OUT/floor.txt
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

CASES = ((16384, 8, 2), (16384, 64, 6), (16384, 128, 8), (16384, 160, 6), (16384, 512, 8), (65536, 256, 8),
         (4096, 60, 4), (256, 128, 8))


@triton.jit
def read_once_kernel(x_ptr, v_ptr, i_ptr, rows, n, k, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_N)
    mask = (r[:, None] < rows) & (c[None, :] < n)
    x = tl.load(x_ptr + r[:, None] * n + c[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    kk = tl.arange(0, BLOCK_K)
    out_mask = (r[:, None] < rows) & (kk[None, :] < k)
    tl.store(v_ptr + r[:, None] * k + kk[None, :], m[:, None] + kk[None, :].to(tl.float32), mask=out_mask)
    tl.store(i_ptr + r[:, None] * k + kk[None, :], kk[None, :].to(tl.int64) + r[:, None].to(tl.int64), mask=out_mask)


def floor_us(rows: int, n: int, k: int, dtype: torch.dtype) -> tuple[float, int, int, float]:
    """Best (time in us, rows per program, warps) over a small grid of launch shapes, and x.sum's time."""
    x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
    values = torch.empty(rows, k, device="cuda", dtype=torch.float32)
    indices = torch.empty(rows, k, device="cuda", dtype=torch.int64)
    block_n = triton.next_power_of_2(n)
    best = (float("inf"), 0, 0)
    for block_r in (1, 2, 4, 8, 16, 32):
        if not 32 <= block_r * block_n <= 16384:
            continue
        for warps in (1, 2, 4):
            grid = (triton.cdiv(rows, block_r),)

            def run(grid=grid, block_r=block_r, warps=warps):
                read_once_kernel[grid](x, values, indices, rows, n, k, BLOCK_R=block_r, BLOCK_N=block_n,
                                       BLOCK_K=triton.next_power_of_2(k), num_warps=warps)

            run()
            best = min(best, (do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3, block_r, warps))
    sum_us = do_bench(lambda: x.sum(-1), warmup=25, rep=100, return_mode="median") * 1e3
    return (*best, sum_us)


def main() -> None:
    for dtype in (torch.float16, torch.float32):
        for rows, n, k in CASES:
            us, block_r, warps, sum_us = floor_us(rows, n, k, dtype)
            print(f"{rows}x{n}k{k} {str(dtype)[6:]:9s} floor {us:6.1f}us (BLOCK_R {block_r}, warps {warps})  "
                  f"x.sum {sum_us:6.1f}us", flush=True)


if __name__ == "__main__":
    main()
