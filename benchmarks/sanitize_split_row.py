"""Forced split_row on aligned rows (16-byte packs, the interleaved parts of session 18), forward, log and
backward, every result checked against float64, for compute-sanitizer.

Usage on a GPU machine: compute-sanitizer --tool memcheck python3 benchmarks/sanitize_split_row.py
(session 18: 27 results checked, 0 errors; *session18-c8-memcheck-split.txt*). benchmarks/sanitize_subset.py
covers split_row on misaligned (single-element) rows.
"""
import torch

import softmax_ops

# Rows of several parts, a row whose last block is partial, 16-bit and float32 packs.
SHAPES = ((2, 70000), (3, 131072), (1, 8192 * 9 + 16))


def main() -> None:
    checked = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for shape in SHAPES:
            x = torch.randn(shape, device="cuda", dtype=dtype) * 3
            with softmax_ops.force_kernel("softmax", "split_row"):
                y = softmax_ops.softmax(x, -1)
                log_y = softmax_ops.log_softmax(x, -1)
            assert torch.allclose(y.double(), torch.softmax(x.double(), -1), atol=2e-3, rtol=2e-2), (dtype, shape)
            assert torch.allclose(log_y.double(), torch.log_softmax(x.double(), -1), atol=5e-2, rtol=2e-2), (dtype, shape)
            grad = torch.randn_like(y)
            with softmax_ops.force_kernel("softmax_backward", "split_row"):
                dx = torch.ops.softmax_ops.softmax_backward(grad, y, -1, dtype)
            y64, grad64 = y.double(), grad.double()
            reference = y64 * (grad64 - (grad64 * y64).sum(-1, keepdim=True))
            assert torch.allclose(dx.double(), reference, atol=5e-2, rtol=5e-2), (dtype, shape)
            checked += 3
    torch.cuda.synchronize()
    print("checked", checked)


if __name__ == "__main__":
    main()
