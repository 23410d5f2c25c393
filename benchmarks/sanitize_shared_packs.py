"""Runs the softmax block kernel's plans that cache packs in shared memory (16-byte aligned rows: the packs arrive by
cp.async and are waited for where they are first read), forward and backward, for compute-sanitizer; each result is
checked against torch.

Usage on a GPU machine::

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_shared_packs.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_shared_packs.py
"""

from __future__ import annotations

import torch

import softmax_ops

# Row counts and lengths whose automatic plans keep packs in shared memory on an H100 (explain says "in shared
# memory"): a cooperative grid group, clusters, and one CTA per row.
SHAPES = [(64, 151936), (32, 1000003), (100, 262144), (300, 50257)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def main() -> None:
    checked = 0
    for shape in SHAPES:
        for dtype in DTYPES:
            plan = softmax_ops.explain(shape, dtype)
            if "in shared memory" not in plan or "+ 0 in shared memory" in plan:
                print(f"{shape} {dtype}: no shared-memory packs here, skipped ({plan.splitlines()[1].strip()})")
                continue
            x = (torch.randn(shape, device="cuda") * 3).to(dtype)
            y = softmax_ops.softmax(x, -1)
            torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1).to(dtype).float(), atol=2e-3, rtol=2e-2)
            grad = torch.randn_like(x)
            dx = torch.ops.softmax_ops.softmax_backward(grad, y, -1, dtype)
            expected = torch._softmax_backward_data(grad.float(), y.float(), -1, torch.float32).to(dtype)
            torch.testing.assert_close(dx.float(), expected.float(), atol=2e-3, rtol=2e-2)
            checked += 1
    torch.cuda.synchronize()
    print(f"shared-memory packs: {checked} (shape, dtype) cases checked forward and backward")


if __name__ == "__main__":
    main()
