"""Runs every CUDA kernel of every family once or twice on small awkward shapes, for compute-sanitizer.

Usage on a GPU machine: compute-sanitizer --tool memcheck python3 benchmarks/sanitize_subset.py
A forced kernel that cannot handle a shape raises; those combinations are skipped and counted.
"""

from __future__ import annotations

import torch

import softmax_ops

SHAPES = [(3, 1), (5, 33), (2, 1000), (3, 4097), (2, 70001), (1, 300007)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def unaligned_input(shape, dtype) -> torch.Tensor:
    """Normal values x 3, without the first column (a row start off every vector boundary)."""
    if shape[1] == 1:
        return torch.randn(shape, device="cuda").to(dtype)
    return (torch.randn(shape, device="cuda") * 3).to(dtype)[:, 1:]


def run_family(family: str, call, shapes=SHAPES, dtypes=DTYPES, make_input=unaligned_input) -> tuple[int, int]:
    """call(make_input(shape, dtype)) under every forced kernel of family: (runs, combinations the kernel refused)."""
    ran = skipped = 0
    for kernel in softmax_ops.list_kernels(family):
        with softmax_ops.force_kernel(family, kernel):
            for shape in shapes:
                for dtype in dtypes:
                    x = make_input(shape, dtype)
                    try:
                        call(x)
                        torch.cuda.synchronize()
                        ran += 1
                    except (RuntimeError, ValueError) as error:
                        if "cannot" not in str(error) and "can't" not in str(error):
                            raise
                        skipped += 1
    return ran, skipped


def main() -> None:
    def softmax_fwd_bwd(x):
        x = x.detach().requires_grad_(True)
        softmax_ops.softmax(x, -1).sum().backward()
        softmax_ops.log_softmax(x, -1, dtype=torch.float32).sum().backward()

    def topk_fwd_bwd(x):
        k = min(8, x.shape[-1])
        x = x.detach().requires_grad_(True)
        values, _ = softmax_ops.fused_topk(x, k, -1, False)
        values.sum().backward()
        softmax_ops.fused_topk(x, x.shape[-1], -1, True)

    # grid_onepass streaming the rest of each chunk (rows longer than its CTAs cache; a 16-byte and a
    # single-element path), once each: too large to run every kernel on.
    streamed = 0
    for n in (8_000_000, 8_000_001):
        for dtype in (torch.float32, torch.float16):
            x = (torch.randn((3, n + 1), device="cuda") * 3).to(dtype)[:, 1:]
            with softmax_ops.force_kernel("softmax", "grid_onepass"), \
                    softmax_ops.force_kernel("softmax_backward", "grid_onepass"):
                assert "streamed" in softmax_ops.explain((3, n), dtype, op="softmax")
                softmax_fwd_bwd(x.contiguous())
                torch.cuda.synchronize()
                streamed += 1
    print(f"grid_onepass streaming chunks: {streamed} runs")

    # The automatic plans of few rows (a cluster of 16 CTAs, relaxed exit barrier) and of many 16-bit rows
    # (the lean exp-once block instance), at a bucket edge and a ragged size each.
    automatic = 0
    for shape, dtype, plan in [((3, 16384), torch.float16, "cluster_onepass"), ((3, 131072), torch.bfloat16, "cluster_onepass"),
                               ((150, 2056), torch.float16, "lean instance"), ((140, 8192), torch.bfloat16, "lean instance")]:
        assert plan in softmax_ops.explain(shape, dtype, op="softmax"), (shape, dtype)
        softmax_fwd_bwd((torch.randn(shape, device="cuda") * 3).to(dtype))
        torch.cuda.synchronize()
        automatic += 1
    print(f"automatic cluster / lean plans: {automatic} runs")

    for family, call in [("softmax", softmax_fwd_bwd), ("softmax_backward", softmax_fwd_bwd),
                         ("topk", topk_fwd_bwd), ("topk_backward", topk_fwd_bwd)]:
        ran, skipped = run_family(family, call)
        print(f"{family}: {ran} runs, {skipped} shape/kernel combinations not supported by the forced kernel")


if __name__ == "__main__":
    main()
