"""Peeled rows (lengths that break 16-byte packs: each row's aligned body in packs, the elements around it
singly) on every kernel with a peeled form, forced, plus the automatic plans: forward, log and
backward, every result checked against float64, for compute-sanitizer.

Run it without PyTorch's caching allocator, so that every tensor is its own allocation and a read or write
one element past a row's end is outside it:
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_peeled_rows.py
(``--automatic``: the automatic plans only.)
"""
import contextlib
import sys

import torch

import softmax_ops

KERNELS = ("warp", "block_onepass", "cluster_onepass", "grid_onepass", "two_pass", "split_row", None)  # None: automatic
# Rows starting at every phase (2 v + 1 rows for v <= 8), a body of one pack, bodies of many packs, 1023, 4095;
# the automatic plan peels many rows, and few long ones (64 x 151935: a grid group; 3 x 2000001: split_row),
# and short ones in the warp kernel (8192 x 1023, 4096 x 101; 4096 x 100: 4 lanes per row at 16 bits, the rows'
# most edge elements). 100 and 102 columns: rows whose edges number 4 and 6 at 16 bits, at any phase; 9, 30 and
# 60 columns: 16-bit lanes holding 4 or 2 edge elements each (kWarpPeelMaxEdgesPerLane). Few float32 forward rows
# in the peeled cluster of the peeled instances' packs (kPeeledClusterMinThreads, session 33; on 132 SMs): 32 x
# 50257, 16 x 100003, 8 x 262143, 8 x 50257, 2 x 100003 and 1 x 50257 (64 x 50257 through peel_few_rows). Few 16-bit
# rows at the register packs their aligned body's plan spreads them over, fewer than the most (peeled_instance,
# session 34): the 16-bit cases of those shapes (clusters and grid groups of 1, 2 and 4 packs), 3 x 100003 and 4 x
# 65537 (clusters of 2 / 1 packs), 3 x 262143 (4 packs), 2 x 1048575 (a grid group of 2 packs); the backward at 1
# pack: 1 x 4097, 8 x 50257 (clusters), 1 x 300007 (a grid group); the float32 backward at 1 and 2 packs: 8 x 16383,
# 4 x 65537 (clusters), 8 x 50257 (a grid group); 16-bit rows with a float32 result (softmax(x, dtype=float32)) at 1,
# 2 and 4 packs: 1 x 50257, 3 x 100003, 3 x 262143 (clusters), 2 x 1048575 (a grid group).
SHAPES = ((17, 9), (17, 31), (17, 100), (17, 102), (17, 1023), (17, 4095), (3, 100003))
AUTOMATIC_SHAPES = ((8192, 1023), (4096, 101), (4096, 100), (4096, 9), (4096, 30), (4096, 60), (140, 4095),
                    (140, 50257), (64, 151935), (3, 2_000_001), (64, 50257), (32, 50257), (8, 262143), (16, 100003),
                    (8, 50257), (1, 50257), (2, 100003), (3, 100003), (4, 65537), (3, 262143), (2, 1_048_575),
                    (1, 4097), (1, 300007), (8, 16383))
WARP_MAX_N = 1023  # 16-bit: 127 packs (the warp kernel holds 32 lanes x 8 packs); float32 255


def forced(family, kernel):
    return softmax_ops.force_kernel(family, kernel) if kernel else contextlib.nullcontext()


def main() -> None:
    checked = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for kernel in (None,) if "--automatic" in sys.argv else KERNELS:
            for shape in SHAPES if kernel else AUTOMATIC_SHAPES:
                if kernel == "block_onepass" and shape[1] > 50000:
                    continue  # the backward's two streams do not fit one CTA
                if kernel == "warp" and shape[1] > WARP_MAX_N:
                    continue  # beyond the warp kernel's registers
                x = torch.randn(shape, device="cuda", dtype=dtype) * 3
                with forced("softmax", kernel):
                    y = softmax_ops.softmax(x, -1)
                    log_y = softmax_ops.log_softmax(x, -1)
                x64 = x.double()
                assert torch.allclose(y.double(), torch.softmax(x64, -1), atol=2e-3, rtol=2e-2), (dtype, kernel, shape)
                assert torch.allclose(log_y.double(), torch.log_softmax(x64, -1), atol=5e-2, rtol=2e-2), (
                    dtype, kernel, shape)
                if dtype != torch.float32:  # a float32 result of 16-bit rows (the widening instances)
                    with forced("softmax", kernel):
                        wide = softmax_ops.softmax(x, -1, dtype=torch.float32)
                        log_wide = softmax_ops.log_softmax(x, -1, dtype=torch.float32)
                    assert torch.allclose(wide.double(), torch.softmax(x64, -1), atol=1e-5, rtol=1e-4), (
                        dtype, kernel, shape)
                    assert torch.allclose(log_wide.double(), torch.log_softmax(x64, -1), atol=1e-4, rtol=1e-4), (
                        dtype, kernel, shape)
                    checked += 2
                grad = torch.randn_like(y)
                with forced("softmax_backward", kernel):
                    dx = torch.ops.softmax_ops.softmax_backward(grad, y, -1, dtype)
                    dlog = torch.ops.softmax_ops.log_softmax_backward(grad, log_y, -1, dtype)
                y64, log64, grad64 = y.double(), log_y.double(), grad.double()
                reference = y64 * (grad64 - (grad64 * y64).sum(-1, keepdim=True))
                assert torch.allclose(dx.double(), reference, atol=5e-2, rtol=5e-2), (dtype, kernel, shape)
                log_reference = grad64 - log64.exp() * grad64.sum(-1, keepdim=True)
                assert torch.allclose(dlog.double(), log_reference, atol=5e-2, rtol=5e-2), (dtype, kernel, shape)
                checked += 4
    torch.cuda.synchronize()
    print("checked", checked)


if __name__ == "__main__":
    main()
