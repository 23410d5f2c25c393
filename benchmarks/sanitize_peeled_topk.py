"""fused_topk on peeled rows (lengths that break 16-byte vectors: each row's aligned body in vector tiles, the
elements around it singly) through block and split_row, forced, plus the automatic plans of two vocabulary
shapes; every result checked against float64, for compute-sanitizer.

Run it without PyTorch's caching allocator, so that every tensor is its own allocation and a read one element
past a row's end is outside it:
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_peeled_topk.py
"""
import contextlib

import torch

import softmax_ops

KERNELS = ("block", "split_row", None)  # None: automatic
# Rows starting at every phase (2 v + 1 rows for v <= 8): the shortest peeled row (15 for 16-bit, 7 for
# float32), one tile + 15, two 8192-element split_row chunks + 14 (one chunk fewer than an aligned row needs);
# the automatic plans: block on many 50257-word rows, split_row on few 151935-word rows.
SHAPES = ((17, 15), (17, 7), (17, 4111), (17, 16398))
AUTOMATIC_SHAPES = ((140, 50257), (3, 151935))


def forced(kernel):
    return softmax_ops.force_kernel("topk", kernel) if kernel else contextlib.nullcontext()


def distinct(shape, dtype):
    """Rows of distinct values exact in every dtype's ordering after rounding (a permuted grid)."""
    rows, n = shape
    grid = torch.arange(n, dtype=torch.float64) * (8.0 / n) - 4.0
    x = torch.stack([grid[torch.randperm(n)] for _ in range(rows)])
    return x.to(dtype).cuda()


def main() -> None:
    checked = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for kernel in KERNELS:
            for shape in SHAPES if kernel else AUTOMATIC_SHAPES:
                x = distinct(shape, dtype)
                x64 = x.double()
                for k in sorted({1, min(50, shape[1])}):
                    with forced(kernel):
                        values, indices = softmax_ops.fused_topk(x, k)
                    # Stable sort of the cast logits: ties (16-bit rounding) to the lower index, as the contract.
                    order = torch.sort(x64, dim=-1, descending=True, stable=True).indices[:, :k]
                    assert torch.equal(indices, order), (dtype, kernel, shape, k)
                    expected = torch.softmax(x64, -1).gather(-1, order)
                    assert torch.allclose(values.double(), expected, atol=2e-3, rtol=2e-2), (dtype, kernel, shape, k)
                    checked += 1
    torch.cuda.synchronize()
    print("checked", checked)


if __name__ == "__main__":
    main()
