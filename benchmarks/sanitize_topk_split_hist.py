"""compute-sanitizer target for the fused_topk split_hist kernel, forced on small awkward shapes: vector and
misaligned (scalar) loads, one and several chunks per row, partial last tiles, k from 1 to N, renormalize on/off,
every dtype, and rows whose floor bin overflows the candidate list (constant rows: the exact fallback).

Usage on a GPU machine: compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_topk_split_hist.py
"""
import torch

import softmax_ops

runs = 0
with softmax_ops.force_kernel("topk", "split_hist"):
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for rows, n in [(1, 1), (3, 100), (2, 4097), (3, 12289), (2, 20000)]:
            for k in sorted({1, min(7, n), min(300, n), n}):
                if k > 4096:
                    continue  # beyond the candidate buffer's shared memory (the forced kernel raises)
                for offset in (0, 1):  # 1: the data one element past a 16-byte boundary (scalar loads)
                    flat = torch.empty(rows * n + offset, device="cuda", dtype=dtype)[offset:]
                    x = flat.view(rows, n).copy_(torch.randn(rows, n, device="cuda") * 3)
                    softmax_ops.fused_topk(x, k, -1, k % 2 == 0)
                    x[0] = 1.5  # a constant row: its floor bin holds N values (the fallback when N > the list)
                    softmax_ops.fused_topk(x, k, -1, k % 2 == 1)
                    runs += 2
torch.cuda.synchronize()
print(f"split_hist kernel: {runs} runs")
