"""compute-sanitizer target for the fused_topk rows kernel, forced on small awkward shapes: vector and
misaligned (scalar) loads, every K instance, renormalize on/off, partial CTAs, and rows of equal values (float32's
exact-word fallback); and on many rows (few threads per row, 16-32 values per thread, 16-bit rows in batches and
on the threads that hold them).

Usage on a GPU machine: compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_topk_rows.py
"""

import torch

import softmax_ops

runs = 0
with softmax_ops.force_kernel("topk", "rows"):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        shapes = [
            (1, 1),
            (37, 7),
            (37, 64),
            (5, 100),
            (33, 160),
            (3, 257),
            (37, 512),
            (16381, 64),
            (8191, 256),
        ]
        for rows, n in shapes:
            for k in sorted({1, min(2, n), min(5, n), min(8, n)}):
                for offset in (0, 1):  # 1: the data one element past a 16-byte boundary (scalar loads)
                    flat = torch.empty(rows * n + offset, device="cuda", dtype=dtype)[offset:]
                    x = flat.view(rows, n).copy_(torch.randn(rows, n, device="cuda") * 3)
                    softmax_ops.fused_topk(x, k, -1, k % 2 == 0)
                    x[:, : n // 2] = 1.5  # equal values: float32 takes the exact-word fallback
                    softmax_ops.fused_topk(x, k, -1, k % 2 == 0)
                    runs += 2
    # Batched instances: many 16-bit rows (the dispatcher's own plan, half the threads that hold a row, each in
    # batches of 32 values), a partial last batch (264), NaN / +inf rows (the reload of every batch).
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype in (torch.float16, torch.bfloat16):
        # rows: 24 warps per SM at half the threads that hold a row (4 for 256 columns, 8 for 264 and 512)
        for rows, n in ((24 * sms * 8 + 8, 256), (24 * sms * 4 + 8, 264), (24 * sms * 4 + 8, 512)):
            assert "batches of 32 values" in softmax_ops.explain((rows, n), dtype, op="fused_topk", k=3)
            for k in (3, 8):
                x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
                softmax_ops.fused_topk(x, k, -1, False)
                x[7, 5] = float("nan")
                x[rows - 1, n - 1] = float("inf")
                softmax_ops.fused_topk(x, k, -1, True)
                runs += 2
    # Many 16-bit rows on the threads that hold them (3-4 packs per thread), NaN / +inf rows (the reload).
    for dtype in (torch.float16, torch.bfloat16):
        # 4 / 8 threads per row (the threads that hold it), too few rows for batches on any SM count
        for rows, n, threads in ((2 * 8 * sms * 32 + 5, 128, 4), (100 * sms + 3, 200, 8)):
            text = softmax_ops.explain((rows, n), dtype, op="fused_topk", k=8)
            assert f"({threads} threads per row" in text and "batches" not in text, text
            for k in (4, 8):
                x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
                softmax_ops.fused_topk(x, k, -1, False)
                x[3, 7] = float("nan")
                x[rows - 2, 0] = float("inf")
                softmax_ops.fused_topk(x, k, -1, True)
                runs += 2
torch.cuda.synchronize()
print(f"rows kernel: {runs} runs")
